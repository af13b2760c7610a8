#include "workers/models/qwen_image/scheduler.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "workers/models/json_config.h"
#include "workers/models/layers.h"

namespace dray::qwen_image {
namespace {

// ShiftSigmas applies diffusers' shift and terminal stretch to `sigmas` in
// precision T, casting Python scalars to T as NumPy 1.x does for arrays of T.
// (The stretch's scale factor is a NumPy scalar divided by a Python float:
// float64 whatever T is, then cast to T when it meets the array.) A
// schedule of one step, sigma 1, is not stretched: diffusers divides 0 by 0
// there and every sigma becomes NaN (a one-step edit, e.g. a distilled
// generator's, would be black).
template <typename T>
std::vector<T> ShiftSigmas(std::vector<T> sigmas, const FlowMatchEulerConfig& config, double mu) {
  for (T& s : sigmas) {
    if (config.use_dynamic_shifting) {
      const T e = static_cast<T>(config.time_shift_type == "linear" ? mu : std::exp(mu));
      s = e / (e + (T(1) / s - T(1)));  // (1/t - 1) ** 1.0 is exact
    } else {
      const T shift = static_cast<T>(config.shift);
      s = shift * s / (T(1) + (static_cast<T>(config.shift - 1)) * s);
    }
  }
  const bool from_pure_noise_only = sigmas.back() == T(1);
  if (config.shift_terminal.has_value() && *config.shift_terminal != 0 && !from_pure_noise_only) {
    const T last = T(1) - sigmas.back();
    const T scale = static_cast<T>(static_cast<double>(last) / (1.0 - *config.shift_terminal));
    for (T& s : sigmas) s = T(1) - ((T(1) - s) / scale);
  }
  return sigmas;
}

}  // namespace

absl::StatusOr<FlowMatchEulerConfig> FlowMatchEulerConfig::FromJson(JsonConfig json) {
  FlowMatchEulerConfig config;
  int64_t train_steps = config.num_train_timesteps, base_len = config.base_image_seq_len,
          max_len = config.max_image_seq_len;
  DRAY_RETURN_IF_ERROR(json.Get("num_train_timesteps", &train_steps));
  DRAY_RETURN_IF_ERROR(json.Get("shift", &config.shift));
  DRAY_RETURN_IF_ERROR(json.Get("use_dynamic_shifting", &config.use_dynamic_shifting));
  DRAY_RETURN_IF_ERROR(json.Get("base_shift", &config.base_shift));
  DRAY_RETURN_IF_ERROR(json.Get("max_shift", &config.max_shift));
  DRAY_RETURN_IF_ERROR(json.Get("base_image_seq_len", &base_len));
  DRAY_RETURN_IF_ERROR(json.Get("max_image_seq_len", &max_len));
  DRAY_RETURN_IF_ERROR(json.Get("shift_terminal", &config.shift_terminal));
  DRAY_RETURN_IF_ERROR(json.Get("time_shift_type", &config.time_shift_type));
  for (const char* key : {"invert_sigmas", "use_karras_sigmas", "use_exponential_sigmas",
                          "use_beta_sigmas", "stochastic_sampling"}) {
    DRAY_RETURN_IF_ERROR(json.Unsupported(key));
  }
  DRAY_RETURN_IF_ERROR(json.Finish());
  if (train_steps < 1 || base_len >= max_len) {
    return absl::InvalidArgumentError(
        "scheduler config: needs num_train_timesteps >= 1 and base_image_seq_len < "
        "max_image_seq_len");
  }
  if (config.time_shift_type != "exponential" && config.time_shift_type != "linear") {
    return absl::InvalidArgumentError(absl::StrCat("scheduler config: time_shift_type '",
                                                   config.time_shift_type,
                                                   "' is neither \"exponential\" nor \"linear\""));
  }
  config.num_train_timesteps = static_cast<int>(train_steps);
  config.base_image_seq_len = static_cast<int>(base_len);
  config.max_image_seq_len = static_cast<int>(max_len);
  return config;
}

absl::StatusOr<FlowMatchEulerConfig> FlowMatchEulerConfig::FromFile(const std::string& path) {
  DRAY_ASSIGN_OR_RETURN(JsonConfig json, JsonConfig::ReadFile(path));
  return FromJson(std::move(json));
}

FlowMatchEulerConfig FlowMatchEulerConfig::QwenImage() {
  FlowMatchEulerConfig config;
  config.use_dynamic_shifting = true;
  config.base_shift = 0.5;
  config.max_shift = 0.9;
  config.base_image_seq_len = 256;
  config.max_image_seq_len = 8192;
  config.shift_terminal = 0.02;
  return config;
}

std::string FlowMatchEulerConfig::ToJson() const {
  nlohmann::json json = {{"_class_name", "FlowMatchEulerDiscreteScheduler"},
                         {"_diffusers_version", kDiffusersVersion},
                         {"num_train_timesteps", num_train_timesteps},
                         {"shift", shift},
                         {"use_dynamic_shifting", use_dynamic_shifting},
                         {"base_shift", base_shift},
                         {"max_shift", max_shift},
                         {"base_image_seq_len", base_image_seq_len},
                         {"max_image_seq_len", max_image_seq_len},
                         {"shift_terminal", nullptr},
                         {"time_shift_type", time_shift_type}};
  if (shift_terminal.has_value()) json["shift_terminal"] = *shift_terminal;
  return json.dump(2);
}

double CalculateShift(int64_t image_seq_len, int64_t base_seq_len, int64_t max_seq_len,
                      double base_shift, double max_shift) {
  const double m = (max_shift - base_shift) / static_cast<double>(max_seq_len - base_seq_len);
  const double b = base_shift - m * static_cast<double>(base_seq_len);
  return static_cast<double>(image_seq_len) * m + b;
}

std::vector<double> Linspace(double start, double stop, int n) {
  std::vector<double> values;
  if (n <= 0) return values;
  if (n == 1) return {start};
  const double step = (stop - start) / (n - 1);
  for (int i = 0; i < n; ++i) values.push_back(i * step + start);
  values.back() = stop;
  return values;
}

FlowMatchEulerScheduler::FlowMatchEulerScheduler(FlowMatchEulerConfig config)
    : config_(std::move(config)) {}

absl::Status FlowMatchEulerScheduler::SetSigmas(const std::vector<double>& sigmas,
                                                std::optional<double> mu) {
  if (sigmas.empty()) return absl::InvalidArgumentError("SetSigmas: no sigmas");
  if (config_.use_dynamic_shifting && !mu.has_value()) {
    return absl::InvalidArgumentError(
        "SetSigmas: this scheduler shifts by image size and needs mu");
  }
  // The pipeline's sigmas are cast to float32 first, so the shift runs in float32.
  std::vector<float> narrow(sigmas.begin(), sigmas.end());
  Finish(ShiftSigmas(std::move(narrow), config_, mu.value_or(0)));
  return absl::OkStatus();
}

absl::Status FlowMatchEulerScheduler::SetTimesteps(int steps, std::optional<double> mu) {
  if (steps < 1) return absl::InvalidArgumentError(absl::StrCat("SetTimesteps: ", steps, " steps"));
  if (config_.use_dynamic_shifting && !mu.has_value()) {
    return absl::InvalidArgumentError(
        "SetTimesteps: this scheduler shifts by image size and needs mu");
  }
  // The training schedule's float32 extremes, then a float64 linspace between them.
  const float sigma_max = 1.0f;
  const float sigma_min = 1.0f / static_cast<float>(config_.num_train_timesteps);
  const double train = config_.num_train_timesteps;
  std::vector<double> sigmas =
      Linspace(sigma_max * train, static_cast<double>(sigma_min) * train, steps);
  for (double& s : sigmas) s /= train;
  const std::vector<double> shifted = ShiftSigmas(std::move(sigmas), config_, mu.value_or(0));
  Finish(std::vector<float>(shifted.begin(), shifted.end()));
  return absl::OkStatus();
}

void FlowMatchEulerScheduler::Finish(const std::vector<float>& sigmas) {
  const at::Tensor shifted = at::from_blob(const_cast<float*>(sigmas.data()),
                                           {static_cast<int64_t>(sigmas.size())}, at::kFloat)
                                 .clone();
  timesteps_ = shifted * static_cast<float>(config_.num_train_timesteps);
  sigmas_ = at::cat({shifted, at::zeros({1}, at::kFloat)});
  step_index_ = 0;
}

absl::StatusOr<at::Tensor> FlowMatchEulerScheduler::Step(const at::Tensor& model_output,
                                                         const at::Tensor& sample) {
  if (!sigmas_.defined())
    return absl::FailedPreconditionError("Step before SetSigmas or SetTimesteps");
  if (step_index_ + 1 >= sigmas_.size(0)) {
    return absl::FailedPreconditionError(
        absl::StrCat("Step: all ", sigmas_.size(0) - 1, " steps of the schedule are done"));
  }
  if (model_output.sizes() != sample.sizes()) {
    return absl::InvalidArgumentError("Step: model_output and sample differ in shape");
  }
  const at::Tensor dt = sigmas_[step_index_ + 1] - sigmas_[step_index_];
  const at::Tensor previous = AtLeastFloat32(sample) + dt * model_output;
  ++step_index_;
  return previous.to(model_output.scalar_type());
}

absl::StatusOr<FlowMatchEulerScheduler> ShiftedSchedule(const FlowMatchEulerConfig& config,
                                                        int64_t image_seq_len, int steps) {
  if (steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("edit: num_inference_steps must be at least 1, got ", steps));
  }
  FlowMatchEulerScheduler scheduler(config);
  const double mu = CalculateShift(image_seq_len, config.base_image_seq_len,
                                   config.max_image_seq_len, config.base_shift, config.max_shift);
  DRAY_RETURN_IF_ERROR(scheduler.SetSigmas(Linspace(1.0, 1.0 / steps, steps), mu));
  return scheduler;
}

}  // namespace dray::qwen_image
