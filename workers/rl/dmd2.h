// DMD2's objectives (Yin et al. 2024, "Improved Distribution Matching
// Distillation"; tianweiy/DMD2's main/sd_guidance.py and
// sd_unified_model.py, every formula and quirk in
// tests/data/reference/dmd2/README.md): a few-step generator distilled from
// a frozen real score (the teacher) with a trainable fake score that
// tracks the generator's own distribution.
//
//   x0 = the generator's output, from BackwardSimulated's input
//   x_t = Noised(x0, noise, t), t drawn in [min_step, max_step]
//   p_real = x0 - real score's x0 at x_t (with CFG), p_fake likewise
//   grad = (p_real - p_fake) / mean |p_real|        per sample
//   loss_dm = 0.5 mse(x0, x0 - grad)                  d/dx0 = grad / numel
//   loss_fake = mse(fake score(x_t'), target), x_t' from x0.detach()
//   GAN: generator softplus(-D(x0)); classifier softplus(D(x0)) + softplus(-D(real))
//
// The score models' outputs relate x_t, x0 and the noise through a
// ScoreParametrization: DDPM's epsilon prediction (DMD2's Stable Diffusion
// models, what the parity cases use) or flow matching's velocity
// (Qwen-Image).
//
// Thread-safety: a ScoreParametrization is immutable; the functions are pure.
#ifndef DRAY_WORKERS_RL_DMD2_H_
#define DRAY_WORKERS_RL_DMD2_H_

#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"

namespace dray::rl {

// ScoreParametrization: train timestep t (0 .. T-1) -> how x_t mixes x0 and
// the noise, and what the score model predicts there.
class ScoreParametrization {
 public:
  // Epsilon: x_t = sqrt(a_t) x0 + sqrt(1 - a_t) noise, the model predicts
  // the noise; `alphas_cumprod` [T] (diffusers' DDPM/DDIM schedulers).
  static ScoreParametrization Epsilon(const at::Tensor& alphas_cumprod);
  // Velocity: x_t = (1 - s_t) x0 + s_t noise, the model predicts noise - x0;
  // `sigmas` [T].
  static ScoreParametrization Velocity(const at::Tensor& sigmas);

  int64_t train_timesteps() const { return table_.size(0); }

  // Noised: x_t for rows x0 [B, ...], noise like it and timesteps t [B]
  // (int64), in x0's dtype (diffusers' add_noise).
  at::Tensor Noised(const at::Tensor& x0, const at::Tensor& noise, const at::Tensor& t) const;
  // CleanPrediction: the x0 that `prediction` at x_t implies, in float64
  // (DMD2's get_x0_from_noise).
  at::Tensor CleanPrediction(const at::Tensor& xt, const at::Tensor& prediction,
                             const at::Tensor& t) const;
  // Target: what the model's output is trained toward at x_t.
  at::Tensor Target(const at::Tensor& x0, const at::Tensor& noise) const;

 private:
  ScoreParametrization(bool epsilon, at::Tensor table) : epsilon_(epsilon), table_(table) {}
  // Coefficients: (x0's, the noise's) at t, in `dtype`, shaped to broadcast against `like`.
  std::pair<at::Tensor, at::Tensor> Coefficients(const at::Tensor& t, const at::Tensor& like,
                                                 at::ScalarType dtype) const;

  bool epsilon_;
  at::Tensor table_;  // alphas_cumprod or sigmas, [T]
};

// GuidedPrediction: classifier-free guidance as DMD2's predict_noise does
// it, uncond + scale (cond - uncond).
at::Tensor GuidedPrediction(const at::Tensor& uncond, const at::Tensor& cond, double scale);

struct DistributionMatching {
  at::Tensor loss;  // 0.5 mse(x0, x0 - grad): what the generator's backward runs on
  at::Tensor grad;  // the normalised score difference, float64, [B, ...]
};

// kNormalizerFloor: the least mean |p_real| DistributionMatchingLoss
// divides by. DMD2 divides by the mean as it is (then nan_to_num), so a
// sample the teacher reproduces exactly gets a gradient of 1e308;
// verl-omni floors it at 1e-6, as dray does.
inline constexpr double kNormalizerFloor = 1e-6;

// DistributionMatchingLoss: DMD's generator loss for the generator's x0
// (differentiable) from the real and fake scores' x0 predictions at the
// same x_t. Shapes must match: INVALID_ARGUMENT otherwise.
absl::StatusOr<DistributionMatching> DistributionMatchingLoss(const at::Tensor& x0,
                                                              const at::Tensor& real_x0,
                                                              const at::Tensor& fake_x0);

// DenoisingLoss: the fake score's loss, mean((prediction - target)^2) in
// float32 (DMD2's loss_fake_mean).
at::Tensor DenoisingLoss(const at::Tensor& prediction, const at::Tensor& target);

// GeneratorGanLoss: mean softplus(-logits) of the classifier on the
// generator's samples (DMD2's gen_cls_loss).
at::Tensor GeneratorGanLoss(const at::Tensor& fake_logits);

// ClassifierGanLoss: mean softplus(fake) + mean softplus(-real) (DMD2's
// guidance_cls_loss).
at::Tensor ClassifierGanLoss(const at::Tensor& real_logits, const at::Tensor& fake_logits);

// DenoisingSteps: the generator's few-step schedule in train timesteps,
// T-1, T-1-T/n, ... above 0 (DMD2's denoising_step_list for
// denoising_timestep T and num_denoising_step n: 999, 749, 499, 249).
// n < 1 or n > T is INVALID_ARGUMENT.
absl::StatusOr<std::vector<int64_t>> DenoisingSteps(int64_t denoising_timestep, int64_t steps);

// Generator: the generator's x0 prediction for rows x_t at train timestep t.
using Generator = std::function<at::Tensor(const at::Tensor& xt, int64_t t)>;
// NoiseDraw: a standard normal draw shaped like its argument.
using NoiseDraw = std::function<at::Tensor(const at::Tensor& like)>;

struct SimulatedInput {
  at::Tensor clean;  // the generator's own x0 after `selected` steps (start noise if none)
  int64_t timestep;  // steps[selected]: where the generator is trained this time
};

// BackwardSimulated: DMD2's backward simulation (sample_backward), without
// gradients: from `start` (pure noise) the generator runs steps[0 ..
// selected), each x0 re-noised to the next step's timestep with a fresh
// draw, so that the generator trains on inputs of its own making.
SimulatedInput BackwardSimulated(const ScoreParametrization& parametrization,
                                 const std::vector<int64_t>& steps, int64_t selected,
                                 const at::Tensor& start, const Generator& generator,
                                 const NoiseDraw& draw);

// GeneratorInput: the generator's input at `timestep`: `clean` noised with
// `noise`, or `noise` itself at the last train timestep (DMD2's pure-noise rows).
at::Tensor GeneratorInput(const ScoreParametrization& parametrization, const at::Tensor& clean,
                          const at::Tensor& noise, int64_t timestep);

}  // namespace dray::rl

#endif  // DRAY_WORKERS_RL_DMD2_H_
