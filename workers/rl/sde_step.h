// The stochastic step of Flow-GRPO: one step of a flow-matching sampler made
// a Gaussian transition, with the log-density of the step it took, exactly as
// flow_grpo's `sde_step_with_logprob` computes them (see
// tests/data/reference/flow_grpo/README.md for every formula).
//
// A rollout draws the step (`prev_sample` unset: prev = mean + std * noise);
// training recomputes the log-density of a stored step under the current
// policy (`prev_sample` set), differentiable in `model_output`.
//
//   DRAY_ASSIGN_OR_RETURN(SdeStepResult step,
//                         SdeStep(schedule, {noise_pred, timestep, latents, 0.7}));
//   latents = step.prev_sample;  // step.log_prob: [B], one value per sample
//
// The log-probability is a mean over a sample's elements, not a sum: the
// per-element average Gaussian log-density of the transition.
//
// Thread-safety: pure functions.
#ifndef DRAY_WORKERS_RL_SDE_STEP_H_
#define DRAY_WORKERS_RL_SDE_STEP_H_

#include <optional>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dray::rl {

// SdeType: which stochastic process turns the Euler step into a Gaussian.
enum class SdeType {
  kSde,  // flow_grpo's "sde": the reverse-time SDE with the flow's marginals
  kCps,  // flow_grpo's "cps": coefficients-preserving sampling
  // DanceGRPO's flux_step (tests/data/reference/dance_grpo/README.md, b): the
  // SDE drift with eta^2 in place of sde's std_dev_t^2, a transition std of
  // eta sqrt(-dt) (std_dev_t = eta), the log-probability in float32.
  kDance,
};

// ParseSdeType reads "sde", "cps" or "dance".
absl::StatusOr<SdeType> ParseSdeType(absl::string_view name);

// SdeSchedule: a flow-matching schedule as the scheduler holds it.
struct SdeSchedule {
  at::Tensor sigmas;     // [n + 1], from 1 down to 0 (float32; float64 computes in float64)
  at::Tensor timesteps;  // [n] float32, the scheduler's own values
};

struct SdeStepInput {
  at::Tensor model_output;   // [B, ...] the (guided) velocity
  at::Tensor timestep;       // [B] float32: each sample's timestep, bit-equal to a schedule entry
  at::Tensor sample;         // [B, ...] latents before the step
  double noise_level = 0.7;  // eta; 0 gives the plain Euler step
  SdeType type = SdeType::kSde;
  // Set: the step to score (training). Unset: the step is drawn with `noise`.
  std::optional<at::Tensor> prev_sample;
  // Standard normal draws shaped like `sample` (rollout only).
  at::Tensor noise;
};

struct SdeStepResult {
  at::Tensor prev_sample;       // latents after the step (float32)
  at::Tensor log_prob;          // [B]
  at::Tensor prev_sample_mean;  // the Gaussian's mean, shaped like sample
  at::Tensor std_dev_t;         // [B, 1, ...]: its scale, without the sqrt(-dt) factor of "sde"
  at::Tensor sqrt_neg_dt;       // [B, 1, ...]: sqrt(sigma - sigma_next)
};

// DanceGrpoSchedule: DanceGRPO's schedule of `steps` steps, sigmas
// sd3_time_shift(shift, linspace(1, 0, steps + 1)) = shift t / (1 + (shift - 1) t)
// in `dtype` (float32, or float64 for numerics checks), timesteps the
// sigmas x 1000 truncated to integers (held as float32), which the
// transformer sees / 1000.
SdeSchedule DanceGrpoSchedule(int64_t steps, double shift, at::ScalarType dtype = at::kFloat);

// SdeStep takes (or scores) one step. Inputs are cast to float32 first
// (float64 ones stay float64); arithmetic is in the wider of theirs and the
// sigmas' dtype. A timestep that is not in the
// schedule, or the last sigma's, is INVALID_ARGUMENT.
absl::StatusOr<SdeStepResult> SdeStep(const SdeSchedule& schedule, const SdeStepInput& input);

// StepIndex returns the index of `timestep` in `timesteps` by exact float
// equality (the second match if there are several, as diffusers does).
absl::StatusOr<int64_t> StepIndex(const at::Tensor& timesteps, float timestep);

}  // namespace dray::rl

#endif  // DRAY_WORKERS_RL_SDE_STEP_H_
