// Flow-GRPO's sampler: a flow-matching denoising loop whose steps inside an
// SDE window are stochastic (SdeStep) and recorded for training, the others
// plain Euler steps, as flow_grpo's pipeline_with_logprob runs it. The model
// is a callback, so the same loop drives the real transformer (with true
// CFG) and the reference's toy model.
//
//   DRAY_ASSIGN_OR_RETURN(Trajectory t, SampleTrajectory(schedule, noise_latents, predict,
//                                                        draw_noise, {0.7, SdeType::kSde, {0,
//                                                        9}}));
//   ... t.latents[:, j], t.next_latents[:, j], t.timesteps[:, j]: step j of the window ...
//   DRAY_ASSIGN_OR_RETURN(SdeStepResult again, RecomputeStep(schedule, predict, t, j, options));
//   // on-policy: again.log_prob == t.log_probs[:, j]
//
// Thread-safety: pure functions (the callbacks are called on this thread).
#ifndef DRAY_WORKERS_RL_SDE_SAMPLER_H_
#define DRAY_WORKERS_RL_SDE_SAMPLER_H_

#include <functional>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "workers/rl/sde_step.h"

namespace dray::rl {

// PredictVelocity: the model's (guided) velocity for `latents` [B, ...] at
// `timestep` [B] (float32 schedule values, 0..1000).
using PredictVelocity = std::function<absl::StatusOr<at::Tensor>(const at::Tensor& latents,
                                                                 const at::Tensor& timestep)>;

// DrawNoise: standard normal draws shaped like the latents for schedule step
// `step` (drawn for every step, as flow_grpo does, so draws line up).
using DrawNoise = std::function<at::Tensor(int step)>;

// SdeWindow: schedule steps [begin, end) are stochastic and trained (none
// when begin == end, as MixGRPO's window at the schedule's end).
struct SdeWindow {
  int begin = 0;
  int end = 0;
};

struct SdeSamplerOptions {
  double noise_level = 0.7;  // eta inside the window (0 outside)
  SdeType type = SdeType::kSde;
  SdeWindow window;
};

// Trajectory: what a rollout keeps of its window's T steps.
struct Trajectory {
  at::Tensor latents;            // [B, T, ...] before each window step
  at::Tensor next_latents;       // [B, T, ...] after it
  at::Tensor log_probs;          // [B, T]
  at::Tensor prev_sample_means;  // [B, T, ...] each step's Gaussian mean (GRPO-Guard's old mean)
  at::Tensor timesteps;          // [B, T] float32 schedule timesteps
  at::Tensor final_latents;      // [B, ...] after the last step of the schedule
};

// SampleTrajectory denoises `latents` over the whole schedule, without
// gradients. `on_step`
// (optional) is called after each step with (steps done, steps); its error
// ends the loop. An empty window makes every step an ODE step and keeps
// none (T = 0); a window outside [0, steps) is INVALID_ARGUMENT.
absl::StatusOr<Trajectory> SampleTrajectory(
    const SdeSchedule& schedule, at::Tensor latents, const PredictVelocity& predict,
    const DrawNoise& draw_noise, const SdeSamplerOptions& options,
    const std::function<absl::Status(int step, int steps)>& on_step = nullptr);

// OdeTrajectory: the trajectory of a rollout without SDE steps (T = 0)
// that ended at `final_latents` (an empty window's, DiffusionNFT's).
Trajectory OdeTrajectory(const at::Tensor& final_latents, const SdeSchedule& schedule);

// RecomputeStep scores window step `j` of `trajectory` under `predict` (the
// current policy): the training path, differentiable through predict.
absl::StatusOr<SdeStepResult> RecomputeStep(const SdeSchedule& schedule,
                                            const PredictVelocity& predict,
                                            const Trajectory& trajectory, int64_t j,
                                            const SdeSamplerOptions& options);
// RecomputeStep with each row's own window step, `steps` [B] int64
// (DanceGRPO trains a subset of its own per sample).
absl::StatusOr<SdeStepResult> RecomputeStep(const SdeSchedule& schedule,
                                            const PredictVelocity& predict,
                                            const Trajectory& trajectory, const at::Tensor& steps,
                                            const SdeSamplerOptions& options);

// AtSteps: each row's entry steps[b] of a [B, T, ...] trajectory part ([B, ...]).
at::Tensor AtSteps(const at::Tensor& part, const at::Tensor& steps);

}  // namespace dray::rl

#endif  // DRAY_WORKERS_RL_SDE_SAMPLER_H_
