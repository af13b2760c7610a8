#include "workers/rl/dmd2.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "absl/strings/str_cat.h"
#include "base/shape_string.h"
#include "workers/rl/per_sample.h"

namespace dray::rl {

ScoreParametrization ScoreParametrization::Epsilon(const at::Tensor& alphas_cumprod) {
  return ScoreParametrization(true, alphas_cumprod);
}

ScoreParametrization ScoreParametrization::Velocity(const at::Tensor& sigmas) {
  return ScoreParametrization(false, sigmas);
}

std::pair<at::Tensor, at::Tensor> ScoreParametrization::Coefficients(const at::Tensor& t,
                                                                     const at::Tensor& like,
                                                                     at::ScalarType dtype) const {
  const at::Tensor level = table_.to(like.device(), dtype)
                               .index_select(0, t.to(like.device()))
                               .view(PerSampleShape(like));
  if (epsilon_) return {level.sqrt(), (1 - level).sqrt()};
  return {1 - level, level};
}

at::Tensor ScoreParametrization::Noised(const at::Tensor& x0, const at::Tensor& noise,
                                        const at::Tensor& t) const {
  const auto [signal, spread] = Coefficients(t, x0, x0.scalar_type());
  return signal * x0 + spread * noise;
}

at::Tensor ScoreParametrization::CleanPrediction(const at::Tensor& xt, const at::Tensor& prediction,
                                                 const at::Tensor& t) const {
  const auto [signal, spread] = Coefficients(t, xt, at::kDouble);
  const at::Tensor x = xt.to(at::kDouble);
  const at::Tensor p = prediction.to(at::kDouble);
  if (epsilon_) return (x - spread * p) / signal;
  return x - spread * p;
}

at::Tensor ScoreParametrization::Target(const at::Tensor& x0, const at::Tensor& noise) const {
  return epsilon_ ? noise : noise - x0;
}

at::Tensor GuidedPrediction(const at::Tensor& uncond, const at::Tensor& cond, double scale) {
  return uncond + scale * (cond - uncond);
}

absl::StatusOr<DistributionMatching> DistributionMatchingLoss(const at::Tensor& x0,
                                                              const at::Tensor& real_x0,
                                                              const at::Tensor& fake_x0) {
  if (x0.dim() < 2 || real_x0.sizes() != x0.sizes() || fake_x0.sizes() != x0.sizes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("distribution matching loss: x0 ", ShapeString(x0.sizes()), ", real_x0 ",
                     ShapeString(real_x0.sizes()), " and fake_x0 ", ShapeString(fake_x0.sizes()),
                     " must share one shape [B, ...]"));
  }
  DistributionMatching out;
  {
    at::NoGradGuard no_grad;
    const at::Tensor p_real = x0 - real_x0;
    const at::Tensor p_fake = x0 - fake_x0;
    const at::Tensor scale =
        p_real.abs().mean(SampleDims(x0), /*keepdim=*/true).clamp_min(kNormalizerFloor);
    out.grad = at::nan_to_num((p_real - p_fake) / scale);
  }
  const at::Tensor target = (x0 - out.grad).detach().to(at::kFloat);
  out.loss = 0.5 * at::mse_loss(x0.to(at::kFloat), target);
  return out;
}

at::Tensor DenoisingLoss(const at::Tensor& prediction, const at::Tensor& target) {
  return (prediction.to(at::kFloat) - target.to(at::kFloat)).pow(2).mean();
}

at::Tensor GeneratorGanLoss(const at::Tensor& fake_logits) {
  return at::softplus(-fake_logits).mean();
}

at::Tensor ClassifierGanLoss(const at::Tensor& real_logits, const at::Tensor& fake_logits) {
  return at::softplus(fake_logits).mean() + at::softplus(-real_logits).mean();
}

absl::StatusOr<std::vector<int64_t>> DenoisingSteps(int64_t denoising_timestep, int64_t steps) {
  if (steps < 1 || steps > denoising_timestep) {
    return absl::InvalidArgumentError(absl::StrCat("the generator's steps (", steps,
                                                   ") must lie in 1 .. ", denoising_timestep,
                                                   " (the denoising timestep)"));
  }
  std::vector<int64_t> list;
  for (int64_t t = denoising_timestep - 1; t > 0; t -= denoising_timestep / steps)
    list.push_back(t);
  return list;
}

SimulatedInput BackwardSimulated(const ScoreParametrization& parametrization,
                                 const std::vector<int64_t>& steps, int64_t selected,
                                 const at::Tensor& start, const Generator& generator,
                                 const NoiseDraw& draw) {
  at::NoGradGuard no_grad;
  at::Tensor noisy = start;
  at::Tensor clean = start;
  for (int64_t i = 0; i < selected; ++i) {
    clean = generator(noisy, steps[i]);
    const at::Tensor next = at::full({start.size(0)}, steps[i + 1], at::kLong);
    noisy = parametrization.Noised(clean, draw(clean), next).to(noisy.scalar_type());
  }
  return {clean, steps[selected]};
}

at::Tensor GeneratorInput(const ScoreParametrization& parametrization, const at::Tensor& clean,
                          const at::Tensor& noise, int64_t timestep) {
  if (timestep == parametrization.train_timesteps() - 1) return noise;
  return parametrization.Noised(clean, noise, at::full({clean.size(0)}, timestep, at::kLong));
}

}  // namespace dray::rl
