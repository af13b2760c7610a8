#include "workers/models/qwen_image/scheduler.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dispatch/status_macros.h"

namespace dray::qwen_image {
namespace {

using nlohmann::json;

// ShiftSigmas applies diffusers' shift and terminal stretch to `sigmas` in
// precision T, casting Python scalars to T as NumPy 1.x does for arrays of T.
// (The stretch's scale factor is a NumPy scalar divided by a Python float:
// float64 whatever T is, then cast to T when it meets the array.)
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
  if (config.shift_terminal.has_value() && *config.shift_terminal != 0) {
    const T last = T(1) - sigmas.back();
    const T scale = static_cast<T>(static_cast<double>(last) / (1.0 - *config.shift_terminal));
    for (T& s : sigmas) s = T(1) - ((T(1) - s) / scale);
  }
  return sigmas;
}

absl::Status Expect(bool ok, const std::string& key, const char* type) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("scheduler config: '", key, "' must be ", type));
}

}  // namespace

absl::StatusOr<FlowMatchEulerConfig> FlowMatchEulerConfig::FromJsonText(const std::string& text) {
  const json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return absl::InvalidArgumentError("scheduler config is not a JSON object");
  }
  FlowMatchEulerConfig config;
  const std::vector<std::string> known = {
      "num_train_timesteps", "shift", "use_dynamic_shifting", "base_shift", "max_shift",
      "base_image_seq_len", "max_image_seq_len", "shift_terminal", "time_shift_type",
      "invert_sigmas", "use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas",
      "stochastic_sampling"};
  for (const auto& [key, value] : parsed.items()) {
    if (key.rfind("_", 0) == 0) continue;  // _class_name, _diffusers_version
    if (key == "num_train_timesteps") {
      DRAY_RETURN_IF_ERROR(Expect(value.is_number_integer() && value.get<int>() > 0, key, "a positive integer"));
      config.num_train_timesteps = value.get<int>();
    } else if (key == "shift" || key == "base_shift" || key == "max_shift") {
      DRAY_RETURN_IF_ERROR(Expect(value.is_number(), key, "a number"));
      (key == "shift" ? config.shift : key == "base_shift" ? config.base_shift : config.max_shift) =
          value.get<double>();
    } else if (key == "base_image_seq_len" || key == "max_image_seq_len") {
      DRAY_RETURN_IF_ERROR(Expect(value.is_number_integer(), key, "an integer"));
      (key == "base_image_seq_len" ? config.base_image_seq_len : config.max_image_seq_len) =
          value.get<int>();
    } else if (key == "use_dynamic_shifting") {
      DRAY_RETURN_IF_ERROR(Expect(value.is_boolean(), key, "true or false"));
      config.use_dynamic_shifting = value.get<bool>();
    } else if (key == "shift_terminal") {
      DRAY_RETURN_IF_ERROR(Expect(value.is_null() || value.is_number(), key, "a number or null"));
      if (value.is_number()) config.shift_terminal = value.get<double>();
    } else if (key == "time_shift_type") {
      DRAY_RETURN_IF_ERROR(Expect(value == "exponential" || value == "linear", key,
                                  "\"exponential\" or \"linear\""));
      config.time_shift_type = value.get<std::string>();
    } else if (key == "invert_sigmas" || key == "use_karras_sigmas" ||
               key == "use_exponential_sigmas" || key == "use_beta_sigmas" ||
               key == "stochastic_sampling") {
      DRAY_RETURN_IF_ERROR(Expect(value.is_boolean(), key, "true or false"));
      if (value.get<bool>()) {
        return absl::UnimplementedError(
            absl::StrCat("scheduler config: '", key, "' = true is not supported by dray"));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("scheduler config: unknown key '", key,
                                                     "'; known keys: ", absl::StrJoin(known, ", ")));
    }
  }
  return config;
}

absl::StatusOr<FlowMatchEulerConfig> FlowMatchEulerConfig::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open scheduler config ", path));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<FlowMatchEulerConfig> config = FromJsonText(text.str());
  if (!config.ok()) return absl::Status(config.status().code(), absl::StrCat(path, ": ", config.status().message()));
  return config;
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
    return absl::InvalidArgumentError("SetSigmas: this scheduler shifts by image size and needs mu");
  }
  // The pipeline's sigmas are cast to float32 first, so the shift runs in float32.
  std::vector<float> narrow(sigmas.begin(), sigmas.end());
  Finish(ShiftSigmas(std::move(narrow), config_, mu.value_or(0)));
  return absl::OkStatus();
}

absl::Status FlowMatchEulerScheduler::SetTimesteps(int steps, std::optional<double> mu) {
  if (steps < 1) return absl::InvalidArgumentError(absl::StrCat("SetTimesteps: ", steps, " steps"));
  if (config_.use_dynamic_shifting && !mu.has_value()) {
    return absl::InvalidArgumentError("SetTimesteps: this scheduler shifts by image size and needs mu");
  }
  // The training schedule's float32 extremes, then a float64 linspace between them.
  const float sigma_max = 1.0f;
  const float sigma_min = 1.0f / static_cast<float>(config_.num_train_timesteps);
  const double train = config_.num_train_timesteps;
  std::vector<double> sigmas = Linspace(sigma_max * train, static_cast<double>(sigma_min) * train, steps);
  for (double& s : sigmas) s /= train;
  const std::vector<double> shifted = ShiftSigmas(std::move(sigmas), config_, mu.value_or(0));
  Finish(std::vector<float>(shifted.begin(), shifted.end()));
  return absl::OkStatus();
}

void FlowMatchEulerScheduler::Finish(const std::vector<float>& sigmas) {
  const at::Tensor shifted =
      at::from_blob(const_cast<float*>(sigmas.data()), {static_cast<int64_t>(sigmas.size())}, at::kFloat).clone();
  timesteps_ = shifted * static_cast<float>(config_.num_train_timesteps);
  sigmas_ = at::cat({shifted, at::zeros({1}, at::kFloat)});
  step_index_ = 0;
}

absl::StatusOr<at::Tensor> FlowMatchEulerScheduler::Step(const at::Tensor& model_output,
                                                         const at::Tensor& sample) {
  if (!sigmas_.defined()) return absl::FailedPreconditionError("Step before SetSigmas or SetTimesteps");
  if (step_index_ + 1 >= sigmas_.size(0)) {
    return absl::FailedPreconditionError(
        absl::StrCat("Step: all ", sigmas_.size(0) - 1, " steps of the schedule are done"));
  }
  if (model_output.sizes() != sample.sizes()) {
    return absl::InvalidArgumentError("Step: model_output and sample differ in shape");
  }
  const at::Tensor dt = sigmas_[step_index_ + 1] - sigmas_[step_index_];
  const at::Tensor previous = sample.to(at::kFloat) + dt * model_output;
  ++step_index_;
  return previous.to(model_output.scalar_type());
}

}  // namespace dray::qwen_image
