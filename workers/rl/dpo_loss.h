// Diffusion-DPO's loss on preference pairs (Wallace et al. 2023), as the
// flow_grpo authors' flow-matching DPO (scripts/train_sd3_dpo.py) and the
// DiffusionDPO authors' train.py compute it (tests/data/reference/flow_dpo/
// README.md): the chosen and rejected image of a pair are noised with one
// noise at one timestep, and the policy is pushed to lower its denoising
// error on the chosen one relative to the rejected one, more than the
// reference model does:
//
//   mse       = mean over a sample's elements of (prediction - target)^2
//   w_l_diff  = (mse_w - mse_ref_w) - (mse_l - mse_ref_l)          per pair
//   inside    = -beta / 2 x w_l_diff
//   loss      = mean over pairs of -logsigmoid(inside) / G
//
// with target the velocity noise - x0 (flow matching) or the noise
// (epsilon prediction); implicit_acc, the share of pairs with inside > 0,
// is how often the policy already prefers the chosen image more than the
// reference does. DpoPairs picks pairs from scored samples, for DPO on a
// policy's own samples (flow_grpo's).
//
//   DpoLossInput in{cat({pred_w, pred_l}), cat({ref_w, ref_l}), cat({target_w, target_l})};
//   DRAY_ASSIGN_OR_RETURN(DpoLossOutput out, DpoLoss(in, {100.0, 7}));
//   out.loss.backward();
//
// Thread-safety: pure functions.
#ifndef DRAY_WORKERS_RL_DPO_LOSS_H_
#define DRAY_WORKERS_RL_DPO_LOSS_H_

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"

namespace dray::rl {

struct DpoLossInput {
  // [2N, ...]: the N pairs' chosen samples, then their rejected ones.
  at::Tensor prediction;      // the policy's (differentiable)
  at::Tensor ref_prediction;  // the reference model's
  at::Tensor target;
};

struct DpoLossOptions {
  double beta = 100.0;             // flow_grpo's train.beta (DiffusionDPO's beta_dpo: 5000)
  int64_t accumulation_steps = 1;  // G: backward passes per optimizer step
};

struct DpoLossOutput {
  at::Tensor loss;           // what backward runs on: unscaled_loss / G
  at::Tensor unscaled_loss;  // mean -logsigmoid(inside)
  at::Tensor mse, ref_mse;   // [2N], float32 at least (flow_grpo's .float())
  at::Tensor model_diff;     // [N] mse_w - mse_l
  at::Tensor ref_diff;       // [N] the reference's
  at::Tensor w_l_diff;       // [N] model_diff - ref_diff
  at::Tensor inside;         // [N] -beta / 2 x w_l_diff
  at::Tensor implicit_acc;   // share of pairs with inside > 0
};

// DpoLoss computes the loss; INVALID_ARGUMENT unless the three tensors
// share one shape with an even, non-zero first dimension.
absl::StatusOr<DpoLossOutput> DpoLoss(const DpoLossInput& in, const DpoLossOptions& options);

// DpoPair: a group's chosen and rejected sample (rows of the batch).
struct DpoPair {
  int64_t chosen = 0;
  int64_t rejected = 0;
};

// DpoPairs picks each group's pair from its samples' `rewards`, in the
// order the groups first appear, as flow_grpo's PerPromptStatTracker
// (type "dpo") does: the first best and the first worst; a group whose
// best is its worst (all tied) pairs its second row over its first.
// INVALID_ARGUMENT for a group of fewer than two samples.
absl::StatusOr<std::vector<DpoPair>> DpoPairs(const std::vector<std::string>& groups,
                                              const std::vector<double>& rewards);

}  // namespace dray::rl

#endif  // DRAY_WORKERS_RL_DPO_LOSS_H_
