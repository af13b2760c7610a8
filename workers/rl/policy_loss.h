// Policy losses for one trained timestep of a micro-batch, registered by
// name (`algorithm.loss`) so that a new loss is one function and one line in
// policy_loss.cc.
//
//   DRAY_ASSIGN_OR_RETURN(PolicyLoss loss_fn, FindPolicyLoss("grpo"));
//   DRAY_ASSIGN_OR_RETURN(PolicyLossOutput out, loss_fn(input, options));
//   out.loss.backward();
//
// Built in: "grpo", flow_grpo's clipped surrogate with its KL term (see
// tests/data/reference/flow_grpo/README.md, section c):
//   A_c = clamp(A, -adv_clip_max, adv_clip_max), ratio = exp(log_prob - old_log_prob)
//   policy_loss = mean_b max(-A_c ratio, -A_c clamp(ratio, 1 - clip_range, 1 + clip_range)) / G
//   kl_loss = mean_b [mean(mean - mean_ref)^2 / (2 std_dev_t^2)] / G        (beta > 0)
//   loss = policy_loss + beta kl_loss
// with G = accumulation_steps (every backward pass before an optimizer step).
// MixGRPO's log-probability penalty (tests/data/reference/mix_grpo/README.md,
// section d) is added to either loss when kl_coeff > 0:
//   log_prob_kl_loss = 0.5 mean_b (log_prob - old_log_prob)^2 / G
//   loss += kl_coeff log_prob_kl_loss  (computed, and differentiable, either way)
//
// "grpo_guard", GRPO-Guard (flow_grpo's train_sd3_GRPO_Guard.py with
// config.rationorm; tests/data/reference/grpo_guard/README.md): the same
// surrogate on a ratio normalised by the step's noise scale, its gradient
// reweighted back:
//   D = mean_b sqrt(-dt) * mean_b std_dev_t
//   bias = mean_{b, ...}(mean - old_mean)^2 / (2 D^2)     (one number for the micro-batch)
//   ratio = exp((log_prob - old_log_prob + bias) D)
//   policy_loss = mean_b max(-A_c ratio, -A_c clamp(ratio, ...)) / mean_b(sqrt(-dt))^2 / G
// and the KL term as "grpo". flow_grpo runs it at clip_range 2e-6 to 4e-6.
//
// Either surrogate's per-sample term is multiplied by is_weight when given
// (rollouts sampled by an older policy than old_log_prob's):
//   policy_loss = mean_b w max(-A_c ratio, -A_c clamp(ratio, ...)) ...
//
// Thread-safety: pure functions.
#ifndef DRAY_WORKERS_RL_POLICY_LOSS_H_
#define DRAY_WORKERS_RL_POLICY_LOSS_H_

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dray::rl {

struct PolicyLossInput {
  at::Tensor advantages;    // [B], this timestep's, before clipping
  at::Tensor log_prob;      // [B] under the current policy (differentiable)
  at::Tensor old_log_prob;  // [B] the rollout's
  // The KL term's (beta > 0 only): the step's Gaussian mean under the policy
  // and the reference policy, and the policy's std_dev_t ([B, 1, ...]).
  at::Tensor prev_sample_mean;
  at::Tensor prev_sample_mean_ref;
  at::Tensor std_dev_t;
  // GRPO-Guard's: the rollout's step mean (shaped like prev_sample_mean) and
  // the step's sqrt(-dt) ([B, 1, ...]); prev_sample_mean and std_dev_t too.
  at::Tensor old_prev_sample_mean;
  at::Tensor sqrt_neg_dt;
  // Asynchronous rollouts' (optional, [B], no gradient): each sample's
  // truncated importance weight pi_old / pi_behaviour, multiplying its
  // surrogate (verl's decoupled rollout correction).
  at::Tensor is_weight;
};

struct PolicyLossOptions {
  double clip_range = 1e-4;        // the ratio's trust region, 1 +- clip_range
  double adv_clip_max = 5.0;       // advantages are clamped to +-adv_clip_max
  double beta = 0.0;               // weight of the KL term to the reference policy
  int64_t accumulation_steps = 1;  // G: backward passes per optimizer step
  double kl_coeff = 0.0;           // weight of MixGRPO's log-probability penalty
};

struct PolicyLossOutput {
  at::Tensor loss;                          // what backward runs on
  at::Tensor policy_loss;                   // divided by G
  at::Tensor kl_loss;                       // divided by G; undefined when beta == 0
  at::Tensor log_prob_kl_loss;              // divided by G
  at::Tensor advantages;                    // [B], clipped
  at::Tensor ratio;                         // [B]
  at::Tensor ratio_bias;                    // GRPO-Guard's RatioNorm bias (a scalar)
  at::Tensor unclipped_loss, clipped_loss;  // [B]
  // Statistics, not divided by G.
  at::Tensor approx_kl;  // 0.5 mean (log_prob - old_log_prob)^2
  at::Tensor clipfrac;   // share of samples with |ratio - 1| > clip_range
  at::Tensor clipfrac_gt_one, clipfrac_lt_one;
};

using PolicyLoss = std::function<absl::StatusOr<PolicyLossOutput>(const PolicyLossInput&,
                                                                  const PolicyLossOptions&)>;

// FindPolicyLoss returns the loss registered as `name`; NOT_FOUND lists the
// registered names.
absl::StatusOr<PolicyLoss> FindPolicyLoss(absl::string_view name);

// PolicyLossNames lists the registered names, sorted.
std::vector<std::string> PolicyLossNames();

}  // namespace dray::rl

#endif  // DRAY_WORKERS_RL_POLICY_LOSS_H_
