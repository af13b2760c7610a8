#include "workers/rl/nft_loss.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "workers/rl/per_sample.h"

namespace dray::rl {
namespace {

absl::StatusOr<at::Tensor> AdvantagesIn(const std::string& mode, const at::Tensor& clipped,
                                        double a) {
  if (mode == "all") return clipped;
  if (mode == "positive_only") return at::clamp(clipped, 0, a);
  if (mode == "negative_only") return at::clamp(clipped, -a, 0);
  if (mode == "one_only")
    return at::where(clipped > 0, at::ones_like(clipped), at::zeros_like(clipped));
  if (mode == "binary") return at::sign(clipped);
  return absl::InvalidArgumentError(
      absl::StrCat("nft loss: adv_mode '", mode,
                   "' is not all, positive_only, negative_only, one_only or binary"));
}

// Pulled: a prediction's distance loss to x0 with its adaptive weight
// (per-sample mean absolute error in float64, a constant, floored at 1e-5).
struct Pulled {
  at::Tensor weight, loss;
};
Pulled Pull(const at::Tensor& x0_prediction, const at::Tensor& x0) {
  at::Tensor weight;
  {
    at::NoGradGuard no_grad;
    weight = at::abs(x0_prediction.to(at::kDouble) - x0.to(at::kDouble))
                 .mean(SampleDims(x0), /*keepdim=*/true)
                 .clamp_min(1e-5);
  }
  return {weight, ((x0_prediction - x0).pow(2) / weight).mean(SampleDims(x0))};
}

}  // namespace

at::Tensor NftNoised(const at::Tensor& x0, const at::Tensor& noise, const at::Tensor& t) {
  const at::Tensor level = t.view(PerSampleShape(x0));
  return (1 - level) * x0 + level * noise;
}

absl::StatusOr<NftLossOutput> NftLoss(const NftLossInput& in, const NftLossOptions& options) {
  const std::vector<const at::Tensor*> shaped = {&in.noise, &in.velocity, &in.old_velocity};
  bool bad = !in.x0.defined() || in.x0.dim() < 2 || !in.t.defined() || !in.advantages.defined() ||
             in.t.sizes() != at::IntArrayRef{in.x0.size(0)} ||
             in.advantages.sizes() != at::IntArrayRef{in.x0.size(0)};
  for (const at::Tensor* tensor : shaped)
    bad = bad || !tensor->defined() || tensor->sizes() != in.x0.sizes();
  if (bad || (in.ref_velocity.defined() && in.ref_velocity.sizes() != in.x0.sizes())) {
    return absl::InvalidArgumentError(
        "nft loss: x0, noise, velocity, old_velocity (and ref_velocity) must share one shape "
        "[B, ...], t and advantages be [B]");
  }
  if (!(options.beta > 0) || options.accumulation_steps < 1) {
    return absl::InvalidArgumentError("nft loss: beta must be > 0 and accumulation_steps >= 1");
  }
  const double a = options.adv_clip_max, beta = options.beta;
  const at::Tensor t = in.t.view(PerSampleShape(in.x0));
  NftLossOutput out;
  out.xt = NftNoised(in.x0, in.noise, in.t);
  auto advantages = AdvantagesIn(options.adv_mode, at::clamp(in.advantages, -a, a), a);
  if (!advantages.ok()) return advantages.status();
  out.advantages = *advantages;
  out.r = at::clamp((out.advantages / a) / 2.0 + 0.5, 0, 1);
  const at::Tensor old = in.old_velocity.detach();
  out.positive_prediction = beta * in.velocity + (1 - beta) * old;
  out.negative_prediction = (1.0 + beta) * old - beta * in.velocity;
  out.x0_prediction = out.xt - t * out.positive_prediction;
  Pulled positive = Pull(out.x0_prediction, in.x0);
  out.weight = positive.weight;
  out.positive_loss = positive.loss;
  out.negative_x0_prediction = out.xt - t * out.negative_prediction;
  Pulled negative = Pull(out.negative_x0_prediction, in.x0);
  out.negative_weight = negative.weight;
  out.negative_loss = negative.loss;
  out.per_sample_loss = out.r * out.positive_loss / beta + (1.0 - out.r) * out.negative_loss / beta;
  out.policy_loss = (out.per_sample_loss * a).mean();
  out.kl_loss = in.ref_velocity.defined()
                    ? (in.velocity - in.ref_velocity).pow(2).mean(SampleDims(in.x0)).mean()
                    : at::zeros({}, in.velocity.options());
  out.total = out.policy_loss + options.kl_beta * out.kl_loss;
  out.loss = out.total / static_cast<double>(options.accumulation_steps);
  return out;
}

absl::StatusOr<double> NftOldPolicyDecay(int64_t step, int decay_type) {
  const double s = static_cast<double>(step);
  switch (decay_type) {
    case 0:
      return 0.0;
    case 1:
      return std::min(0.001 * s, 0.5);
    case 2:
      return step < 75 ? 0.0 : std::min((s - 75) * 0.0075, 0.999);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("nft decay_type ", decay_type, " is not 0, 1 or 2"));
  }
}

at::Tensor NftBlendedPolicy(const at::Tensor& old, const at::Tensor& policy, double decay) {
  return old * decay + policy * (1 - decay);
}

}  // namespace dray::rl
