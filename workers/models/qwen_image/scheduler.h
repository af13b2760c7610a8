// FlowMatchEulerDiscreteScheduler as Qwen-Image uses it: sigmas from 1 down
// to a terminal value, shifted by image size (dynamic shifting, exponential
// time shift), stretched to end at shift_terminal, and Euler steps in float32.
//
//   DRAY_ASSIGN_OR_RETURN(auto config,
//   FlowMatchEulerConfig::FromFile("scheduler/scheduler_config.json")); FlowMatchEulerScheduler
//   scheduler(config); const double mu = CalculateShift(image_seq_len, 256, 8192, 0.5, 0.9);
//   DRAY_RETURN_IF_ERROR(scheduler.SetSigmas(Linspace(1.0, 1.0 / steps, steps), mu));
//   for (int64_t i = 0; i < steps; ++i) {
//     at::Tensor t = scheduler.timesteps()[i];                 // transformer gets t / 1000
//     DRAY_ASSIGN_OR_RETURN(latents, scheduler.Step(noise_pred, latents));
//   }
//
// The arithmetic mirrors diffusers with NumPy 1.x casting, so sigmas and
// timesteps match its float32 values bit for bit.
//
// Thread-safety: a scheduler is not thread-safe (Step advances it).
#ifndef DRAY_WORKERS_MODELS_QWEN_IMAGE_SCHEDULER_H_
#define DRAY_WORKERS_MODELS_QWEN_IMAGE_SCHEDULER_H_

#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "workers/models/json_config.h"

namespace dray::qwen_image {

// FlowMatchEulerConfig: diffusers' scheduler_config.json keys and defaults.
struct FlowMatchEulerConfig {
  int num_train_timesteps = 1000;
  double shift = 1.0;                 // static shift, without dynamic shifting
  bool use_dynamic_shifting = false;  // shift by image size (mu)
  double base_shift = 0.5;
  double max_shift = 1.15;
  int base_image_seq_len = 256;
  int max_image_seq_len = 4096;
  std::optional<double> shift_terminal;         // stretch the schedule to end here
  std::string time_shift_type = "exponential";  // or "linear"

  // FromJson reads a diffusers scheduler_config.json; an unknown key, a
  // wrong type, or an option dray does not implement (karras, exponential
  // or beta sigmas, inverted sigmas, stochastic sampling) is an error.
  static absl::StatusOr<FlowMatchEulerConfig> FromJson(JsonConfig json);
  static absl::StatusOr<FlowMatchEulerConfig> FromFile(const std::string& path);
  // QwenImage returns the configuration Qwen-Image ships with.
  static FlowMatchEulerConfig QwenImage();
  // ToJson writes diffusers' scheduler_config.json for this config.
  std::string ToJson() const;
};

// CalculateShift: mu for an image of `image_seq_len` latent tokens, linear
// between (base_seq_len, base_shift) and (max_seq_len, max_shift).
double CalculateShift(int64_t image_seq_len, int64_t base_seq_len = 256, int64_t max_seq_len = 4096,
                      double base_shift = 0.5, double max_shift = 1.15);

// Linspace: numpy.linspace(start, stop, n), value for value.
std::vector<double> Linspace(double start, double stop, int n);

class FlowMatchEulerScheduler {
 public:
  explicit FlowMatchEulerScheduler(FlowMatchEulerConfig config);

  // SetSigmas starts a schedule from explicit sigmas (what the Qwen-Image
  // pipelines pass: Linspace(1, 1/n, n)); `mu` is required with dynamic shifting.
  absl::Status SetSigmas(const std::vector<double>& sigmas, std::optional<double> mu);

  // SetTimesteps starts the scheduler's own schedule of `steps` steps.
  absl::Status SetTimesteps(int steps, std::optional<double> mu);

  // timesteps: float32 [n], in [0, num_train_timesteps]. sigmas: float32
  // [n + 1], ending in 0.
  const at::Tensor& timesteps() const { return timesteps_; }
  const at::Tensor& sigmas() const { return sigmas_; }
  int step_index() const { return step_index_; }

  // Step moves `sample` one Euler step along `model_output` (in float32,
  // returned in model_output's dtype) and advances the step index.
  absl::StatusOr<at::Tensor> Step(const at::Tensor& model_output, const at::Tensor& sample);

 private:
  // Finish stores shifted float32 sigmas and derives the timesteps.
  void Finish(const std::vector<float>& sigmas);

  FlowMatchEulerConfig config_;
  at::Tensor timesteps_;
  at::Tensor sigmas_;
  int step_index_ = 0;
};

// ShiftedSchedule: the schedule the Qwen-Image and FLUX.1 pipelines run:
// `steps` sigmas from 1 to 1/steps, shifted for `image_seq_len` noisy
// latent tokens by `config`'s calculate_shift; INVALID_ARGUMENT for
// steps < 1.
absl::StatusOr<FlowMatchEulerScheduler> ShiftedSchedule(const FlowMatchEulerConfig& config,
                                                        int64_t image_seq_len, int steps);

}  // namespace dray::qwen_image

#endif  // DRAY_WORKERS_MODELS_QWEN_IMAGE_SCHEDULER_H_
