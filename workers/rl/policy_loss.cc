#include "workers/rl/policy_loss.h"

#include <ATen/ATen.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "workers/rl/per_sample.h"
#include "workers/rl/registry.h"

namespace dray::rl {
namespace {

absl::Status CheckInput(const PolicyLossInput& in, const PolicyLossOptions& options) {
  if (!in.log_prob.defined() || in.log_prob.dim() != 1 || !in.old_log_prob.defined() ||
      !in.advantages.defined() || in.old_log_prob.sizes() != in.log_prob.sizes() ||
      in.advantages.sizes() != in.log_prob.sizes()) {
    return absl::InvalidArgumentError(
        "policy loss: log_prob, old_log_prob and advantages must each be [B]");
  }
  if (in.is_weight.defined() && in.is_weight.sizes() != in.log_prob.sizes())
    return absl::InvalidArgumentError("policy loss: is_weight must be [B] as log_prob");
  if (options.accumulation_steps < 1) {
    return absl::InvalidArgumentError("policy loss: accumulation_steps must be at least 1");
  }
  if (options.beta > 0 &&
      (!in.prev_sample_mean.defined() || !in.prev_sample_mean_ref.defined() ||
       !in.std_dev_t.defined() || in.prev_sample_mean.sizes() != in.prev_sample_mean_ref.sizes() ||
       in.prev_sample_mean.size(0) != in.log_prob.size(0))) {
    return absl::InvalidArgumentError(
        "policy loss: beta > 0 needs prev_sample_mean and prev_sample_mean_ref of one shape "
        "[B, ...] and std_dev_t");
  }
  return absl::OkStatus();
}

// Surrogate is flow_grpo's "# grpo logic" block after the ratio, operation
// for operation (so the dtypes promote as there: float64 advantages make a
// float64 loss), with the policy loss divided by `scale` (1 for GRPO) and G.
absl::StatusOr<PolicyLossOutput> Surrogate(const PolicyLossInput& in,
                                           const PolicyLossOptions& options, PolicyLossOutput out,
                                           const at::Tensor& scale) {
  const double g = static_cast<double>(options.accumulation_steps);
  out.advantages = at::clamp(in.advantages, -options.adv_clip_max, options.adv_clip_max);
  out.unclipped_loss = -out.advantages * out.ratio;
  out.clipped_loss =
      -out.advantages * at::clamp(out.ratio, 1.0 - options.clip_range, 1.0 + options.clip_range);
  at::Tensor per_sample = at::maximum(out.unclipped_loss, out.clipped_loss);
  if (in.is_weight.defined()) per_sample = per_sample * in.is_weight.detach();
  out.policy_loss = at::mean(per_sample);
  if (scale.defined()) out.policy_loss = out.policy_loss / scale;
  out.policy_loss = out.policy_loss / g;
  out.loss = out.policy_loss;
  if (options.beta > 0) {
    const at::Tensor kl = (in.prev_sample_mean - in.prev_sample_mean_ref)
                              .pow(2)
                              .mean(SampleDims(in.prev_sample_mean), true) /
                          (2 * in.std_dev_t.pow(2));
    out.kl_loss = at::mean(kl) / g;
    out.loss = out.policy_loss + options.beta * out.kl_loss;
  }
  out.log_prob_kl_loss = 0.5 * at::mean((in.log_prob - in.old_log_prob).pow(2)) / g;
  if (options.kl_coeff > 0) out.loss = out.loss + options.kl_coeff * out.log_prob_kl_loss;
  const at::Tensor drift = (in.log_prob - in.old_log_prob).detach();
  const at::Tensor ratio = out.ratio.detach();
  out.approx_kl = 0.5 * at::mean(drift.pow(2));
  out.clipfrac = at::mean((at::abs(ratio - 1.0) > options.clip_range).to(at::kFloat));
  out.clipfrac_gt_one = at::mean((ratio - 1.0 > options.clip_range).to(at::kFloat));
  out.clipfrac_lt_one = at::mean((1.0 - ratio > options.clip_range).to(at::kFloat));
  return out;
}

absl::StatusOr<PolicyLossOutput> ClippedGrpo(const PolicyLossInput& in,
                                             const PolicyLossOptions& options) {
  DRAY_RETURN_IF_ERROR(CheckInput(in, options));
  PolicyLossOutput out;
  out.ratio = at::exp(in.log_prob - in.old_log_prob);
  return Surrogate(in, options, std::move(out), at::Tensor());
}

absl::StatusOr<PolicyLossOutput> GrpoGuard(const PolicyLossInput& in,
                                           const PolicyLossOptions& options) {
  DRAY_RETURN_IF_ERROR(CheckInput(in, options));
  if (!in.prev_sample_mean.defined() || !in.old_prev_sample_mean.defined() ||
      !in.std_dev_t.defined() || !in.sqrt_neg_dt.defined() ||
      in.prev_sample_mean.sizes() != in.old_prev_sample_mean.sizes()) {
    return absl::InvalidArgumentError(
        "grpo_guard loss: needs prev_sample_mean and the rollout's old_prev_sample_mean of one "
        "shape, std_dev_t and sqrt_neg_dt");
  }
  // mean over every dimension: upstream's mean(dim=()) of a [B] log_prob's
  // tuple(range(1, 1)) reduces the whole micro-batch to one number.
  const at::Tensor sqrt_dt = in.sqrt_neg_dt.mean();
  const at::Tensor scale = sqrt_dt * in.std_dev_t.mean();
  PolicyLossOutput out;
  out.ratio_bias =
      (in.prev_sample_mean - in.old_prev_sample_mean).pow(2).mean() / (2 * scale.pow(2));
  out.ratio = at::exp((in.log_prob - in.old_log_prob + out.ratio_bias) * scale);
  return Surrogate(in, options, std::move(out), sqrt_dt.pow(2));
}

const std::map<std::string, PolicyLoss>& Registry() {
  static const auto* registry = new std::map<std::string, PolicyLoss>{
      {"grpo", ClippedGrpo},
      {"grpo_guard", GrpoGuard},
  };
  return *registry;
}

}  // namespace

absl::StatusOr<PolicyLoss> FindPolicyLoss(absl::string_view name) {
  return FindRegistered(Registry(), "policy loss", name);
}

std::vector<std::string> PolicyLossNames() { return RegisteredNames(Registry()); }

}  // namespace dray::rl
