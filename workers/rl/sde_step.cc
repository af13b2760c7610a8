#include "workers/rl/sde_step.h"

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/shape_string.h"
#include "base/status_macros.h"
#include "workers/models/layers.h"
#include "workers/rl/per_sample.h"

namespace dray::rl {
namespace {

std::string ShapeOf(const at::Tensor& tensor) {
  return tensor.defined() ? ShapeString(tensor.sizes()) : "(none)";
}

absl::Status CheckInput(const SdeSchedule& schedule, const SdeStepInput& in) {
  if (!schedule.sigmas.defined() || !schedule.timesteps.defined() || schedule.sigmas.dim() != 1 ||
      schedule.timesteps.dim() != 1 || schedule.sigmas.size(0) != schedule.timesteps.size(0) + 1 ||
      schedule.sigmas.size(0) < 2) {
    return absl::InvalidArgumentError(
        "SDE step: the schedule needs timesteps [n] and sigmas [n + 1], n >= 1");
  }
  if (!in.sample.defined() || in.sample.dim() < 2 || !in.model_output.defined() ||
      in.model_output.sizes() != in.sample.sizes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SDE step: model_output ", ShapeOf(in.model_output), " and sample ",
                     ShapeOf(in.sample), " must have one shape [B, ...]"));
  }
  if (!in.timestep.defined() || in.timestep.dim() != 1 ||
      in.timestep.size(0) != in.sample.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat("SDE step: timestep ", ShapeOf(in.timestep),
                                                   " must be [", in.sample.size(0),
                                                   "], one per sample"));
  }
  const at::Tensor& given = in.prev_sample ? *in.prev_sample : in.noise;
  if (!given.defined() || given.sizes() != in.sample.sizes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SDE step: ", in.prev_sample ? "prev_sample " : "noise ", ShapeOf(given),
                     " must be shaped like sample ", ShapeOf(in.sample)));
  }
  return absl::OkStatus();
}

// Indices returns each sample's step index in the schedule, refusing the
// last sigma's (a step needs a next sigma).
absl::StatusOr<at::Tensor> Indices(const SdeSchedule& schedule, const at::Tensor& timestep) {
  const at::Tensor wanted = timestep.to(at::kCPU, at::kFloat).contiguous();
  std::vector<int64_t> indices;
  for (int64_t b = 0; b < wanted.size(0); ++b) {
    DRAY_ASSIGN_OR_RETURN(int64_t index,
                          StepIndex(schedule.timesteps, wanted.data_ptr<float>()[b]));
    indices.push_back(index);
  }
  return at::tensor(indices, at::kLong).to(schedule.sigmas.device());
}

}  // namespace

absl::StatusOr<SdeType> ParseSdeType(absl::string_view name) {
  if (name == "sde") return SdeType::kSde;
  if (name == "cps") return SdeType::kCps;
  if (name == "dance") return SdeType::kDance;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown SDE type '", name, "' (valid: sde, cps, dance)"));
}

absl::StatusOr<int64_t> StepIndex(const at::Tensor& timesteps, float timestep) {
  const at::Tensor all = timesteps.to(at::kCPU, at::kFloat).contiguous();
  std::vector<int64_t> matches;
  for (int64_t i = 0; i < all.size(0); ++i) {
    if (all.data_ptr<float>()[i] == timestep) matches.push_back(i);
  }
  if (matches.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("timestep ", timestep, " is not one of the schedule's ", all.size(0),
                     " timesteps (they must be the scheduler's float32 values, bit for bit)"));
  }
  return matches.size() > 1 ? matches[1] : matches[0];
}

SdeSchedule DanceGrpoSchedule(int64_t steps, double shift, at::ScalarType dtype) {
  const at::Tensor t = at::linspace(1, 0, steps + 1, at::TensorOptions().dtype(dtype));
  const at::Tensor sigmas = shift * t / (1 + (shift - 1) * t);
  return {sigmas, at::trunc(sigmas.narrow(0, 0, steps) * 1000).to(at::kFloat)};
}

absl::StatusOr<SdeStepResult> SdeStep(const SdeSchedule& schedule, const SdeStepInput& in) {
  DRAY_RETURN_IF_ERROR(CheckInput(schedule, in));
  DRAY_ASSIGN_OR_RETURN(at::Tensor index, Indices(schedule, in.timestep));
  const at::Tensor v = AtLeastFloat32(in.model_output);
  const at::Tensor x = AtLeastFloat32(in.sample);
  const std::vector<int64_t> per_sample = PerSampleShape(x);
  const at::Tensor& sigmas = schedule.sigmas;
  const at::Tensor sigma = sigmas.index_select(0, index).view(per_sample);
  const at::Tensor sigma_next = sigmas.index_select(0, index + 1).view(per_sample);
  const double sigma_max = sigmas[1].item<double>();  // the guard at sigma == 1 (flow_grpo's)
  const at::Tensor dt = sigma_next - sigma;           // negative
  const at::Tensor sqrt_neg_dt = at::sqrt(-1 * dt);

  SdeStepResult out;
  out.sqrt_neg_dt = sqrt_neg_dt;
  if (in.type == SdeType::kSde) {
    out.std_dev_t =
        at::sqrt(sigma / (1 - at::where(sigma == 1, sigma_max, sigma))) * in.noise_level;
    const at::Tensor& s = out.std_dev_t;
    out.prev_sample_mean =
        x * (1 + s.pow(2) / (2 * sigma) * dt) + v * (1 + s.pow(2) * (1 - sigma) / (2 * sigma)) * dt;
    out.prev_sample = in.prev_sample
                          ? AtLeastFloat32(*in.prev_sample)
                          : out.prev_sample_mean + s * sqrt_neg_dt * AtLeastFloat32(in.noise);
    const at::Tensor scale = s * sqrt_neg_dt;
    const at::Tensor log_sqrt_2pi =
        at::log(at::sqrt(2 * at::scalar_tensor(M_PI, out.prev_sample_mean.options())));
    out.log_prob = -(out.prev_sample.detach() - out.prev_sample_mean).pow(2) / (2 * scale.pow(2)) -
                   at::log(scale) - log_sqrt_2pi;
  } else if (in.type == SdeType::kDance) {
    const double eta = in.noise_level;
    out.std_dev_t = at::full_like(sigma, eta);
    // Upstream's sigma (a 0-d tensor) times a bfloat16 model output (as
    // under autocast) is a bfloat16 product of sigma rounded to bfloat16.
    const auto times_output = [&](const at::Tensor& scalar) {
      const at::ScalarType type = in.model_output.scalar_type();
      return (scalar.to(type).to(v.scalar_type()) * v).to(type);
    };
    const at::Tensor predicted_image = x - times_output(sigma);
    const at::Tensor score = -(x - predicted_image * (1 - sigma)) / sigma.pow(2);
    out.prev_sample_mean = x + times_output(dt) + (-0.5 * eta * eta * score) * dt;
    const at::Tensor scale = eta * sqrt_neg_dt;
    out.prev_sample = in.prev_sample ? AtLeastFloat32(*in.prev_sample)
                                     : out.prev_sample_mean + AtLeastFloat32(in.noise) * scale;
    // In float32 whatever the inputs, as DanceGRPO's .to(torch.float32).
    const at::Tensor difference =
        out.prev_sample.detach().to(at::kFloat) - out.prev_sample_mean.to(at::kFloat);
    out.log_prob =
        (-difference.pow(2) / (2 * scale.pow(2)) - at::log(scale) - 0.5 * std::log(2 * M_PI))
            .to(at::kFloat);
  } else {
    out.std_dev_t = sigma_next * std::sin(in.noise_level * M_PI / 2);
    const at::Tensor& s = out.std_dev_t;
    const at::Tensor predicted_image = x - sigma * v;
    const at::Tensor predicted_noise = x + v * (1 - sigma);
    out.prev_sample_mean = predicted_image * (1 - sigma_next) +
                           predicted_noise * at::sqrt(sigma_next.pow(2) - s.pow(2));
    out.prev_sample = in.prev_sample ? AtLeastFloat32(*in.prev_sample)
                                     : out.prev_sample_mean + s * AtLeastFloat32(in.noise);
    out.log_prob = -(out.prev_sample.detach() - out.prev_sample_mean).pow(2);
  }
  out.log_prob = out.log_prob.mean(SampleDims(out.log_prob));
  return out;
}

}  // namespace dray::rl
