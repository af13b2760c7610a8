// DiffusionNFT's objective (NVlabs/DiffusionNFT, scripts/train_nft_sd3.py;
// every formula and quirk in tests/data/reference/diffusion_nft/README.md):
// negative-aware fine-tuning on the forward process, with no likelihood and
// no CFG. A rollout's clean latent x0 is noised afresh to xt at t; the
// policy's velocity v and the sampling ("old") policy's v_old make an
// implicit positive policy v+ = beta v + (1 - beta) v_old and negative one
// v- = (1 + beta) v_old - beta v, whose x0 predictions are pulled toward x0
// in proportion r (from the advantage) and 1 - r:
//   xt = (1 - t) x0 + t noise
//   A = clamp(adv, +-a), then adv_mode;  r = clamp(A / a / 2 + 0.5, 0, 1)
//   L+ = mean((xt - t v+ - x0)^2 / w+),
//     w+ = max(mean |xt - t v+ - x0| (float64, a constant), 1e-5);  L- likewise
//   policy_loss = mean_b (r L+ / beta + (1 - r) L- / beta) a
//   loss = (policy_loss + kl_beta mean_b mean (v - v_ref)^2) / G
//
//   DRAY_ASSIGN_OR_RETURN(NftLossOutput out, NftLoss(input, options));
//   out.loss.backward();
//
// Thread-safety: pure functions.
#ifndef DRAY_WORKERS_RL_NFT_LOSS_H_
#define DRAY_WORKERS_RL_NFT_LOSS_H_

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"

namespace dray::rl {

struct NftLossInput {
  at::Tensor x0;            // [B, ...] the rollout's clean latents
  at::Tensor noise;         // [B, ...] a fresh standard normal draw
  at::Tensor t;             // [B] the noise level: the scheduler's timestep / 1000
  at::Tensor advantages;    // [B], before clipping
  at::Tensor velocity;      // [B, ...] the policy's at xt (differentiable)
  at::Tensor old_velocity;  // [B, ...] the sampling policy's at xt
  at::Tensor ref_velocity;  // [B, ...] the reference policy's (kl_beta > 0 only)
};

struct NftLossOptions {
  double beta = 1.0;          // DiffusionNFT's config.beta: how far v+ and v- lie from v_old
  double kl_beta = 1e-4;      // its config.train.beta: weight of the KL to the reference
  double adv_clip_max = 5.0;  // advantages clamped to +-adv_clip_max
  // config.train.adv_mode: all, positive_only, negative_only, one_only or binary.
  std::string adv_mode = "all";
  int64_t accumulation_steps = 1;  // G
};

struct NftLossOutput {
  at::Tensor loss;         // what backward runs on: total / G
  at::Tensor total;        // policy_loss + kl_beta kl_loss (upstream's logged policy_loss too)
  at::Tensor policy_loss;  // KL-free
  at::Tensor kl_loss;      // mean_b mean (v - v_ref)^2 (0 without ref_velocity)
  // Intermediate values, named as upstream's variables.
  at::Tensor xt, advantages, r, positive_prediction, negative_prediction;
  at::Tensor x0_prediction, weight, positive_loss;
  at::Tensor negative_x0_prediction, negative_weight, negative_loss;
  at::Tensor per_sample_loss;  // r L+ / beta + (1 - r) L- / beta, [B]
};

// NftNoised: DiffusionNFT's forward process, xt = (1 - t) x0 + t noise, with
// t [B] (each sample's noise level) and x0, noise [B, ...].
at::Tensor NftNoised(const at::Tensor& x0, const at::Tensor& noise, const at::Tensor& t);

// NftLoss computes the objective for one micro-batch at one timestep each.
// Mismatched shapes, beta <= 0 or an unknown adv_mode are INVALID_ARGUMENT.
absl::StatusOr<NftLossOutput> NftLoss(const NftLossInput& input, const NftLossOptions& options);

// NftOldPolicyDecay is DiffusionNFT's return_decay: after `step` optimizer
// steps the sampling policy becomes old * decay + policy * (1 - decay), with
// decay type 0: 0; 1: min(0.001 step, 0.5); 2: 0 before step 75, then
// min((step - 75) 0.0075, 0.999). Another type is INVALID_ARGUMENT.
absl::StatusOr<double> NftOldPolicyDecay(int64_t step, int decay_type);

// NftBlendedPolicy: the sampling policy's values after that update, old *
// decay + policy * (1 - decay), in their dtype.
at::Tensor NftBlendedPolicy(const at::Tensor& old, const at::Tensor& policy, double decay);

}  // namespace dray::rl

#endif  // DRAY_WORKERS_RL_NFT_LOSS_H_
