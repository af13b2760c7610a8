#include "workers/rl/sde_sampler.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace dray::rl {

absl::StatusOr<Trajectory> SampleTrajectory(
    const SdeSchedule& schedule, at::Tensor latents, const PredictVelocity& predict,
    const DrawNoise& draw_noise, const SdeSamplerOptions& options,
    const std::function<absl::Status(int step, int steps)>& on_step) {
  const int steps = static_cast<int>(schedule.timesteps.size(0));
  const SdeWindow& window = options.window;
  if (window.begin < 0 || window.end > steps || window.begin > window.end) {
    return absl::InvalidArgumentError(absl::StrCat("SDE window [", window.begin, ", ", window.end,
                                                   ") must be a part of the ", steps, " steps"));
  }
  at::NoGradGuard no_grad;  // a rollout only samples; training recomputes its steps
  const int64_t batch = latents.size(0);
  std::vector<at::Tensor> kept, log_probs, means, timesteps;
  for (int i = 0; i < steps; ++i) {
    const bool stochastic = i >= window.begin && i < window.end;
    if (stochastic && i == window.begin) kept.push_back(latents);
    const at::Tensor timestep = schedule.timesteps[i].expand({batch}).contiguous();
    DRAY_ASSIGN_OR_RETURN(at::Tensor velocity, predict(latents, timestep));
    SdeStepInput input{velocity, timestep, latents, stochastic ? options.noise_level : 0.0,
                       options.type};
    input.noise = draw_noise(i);
    DRAY_ASSIGN_OR_RETURN(SdeStepResult step, SdeStep(schedule, input));
    latents = step.prev_sample;
    if (stochastic) {
      kept.push_back(latents);
      log_probs.push_back(step.log_prob);
      means.push_back(step.prev_sample_mean);
      timesteps.push_back(timestep);
    }
    if (on_step) DRAY_RETURN_IF_ERROR(on_step(i + 1, steps));
  }
  if (kept.empty()) return OdeTrajectory(latents, schedule);  // every step was an ODE step
  Trajectory trajectory;
  trajectory.final_latents = latents;
  const at::Tensor all = at::stack(kept, 1);
  const int64_t t = all.size(1) - 1;
  trajectory.latents = all.narrow(1, 0, t);
  trajectory.next_latents = all.narrow(1, 1, t);
  trajectory.log_probs = at::stack(log_probs, 1);
  trajectory.prev_sample_means = at::stack(means, 1);
  trajectory.timesteps = at::stack(timesteps, 1);
  return trajectory;
}

Trajectory OdeTrajectory(const at::Tensor& final_latents, const SdeSchedule& schedule) {
  const int64_t batch = final_latents.size(0);
  Trajectory trajectory;
  trajectory.final_latents = final_latents;
  trajectory.latents = final_latents.unsqueeze(1).narrow(1, 0, 0);
  trajectory.next_latents = trajectory.latents;
  trajectory.prev_sample_means = trajectory.latents;
  trajectory.log_probs = at::empty({batch, 0}, final_latents.options().dtype(at::kFloat));
  trajectory.timesteps = at::empty({batch, 0}, schedule.timesteps.options());
  return trajectory;
}

absl::StatusOr<SdeStepResult> RecomputeStep(const SdeSchedule& schedule,
                                            const PredictVelocity& predict,
                                            const Trajectory& trajectory, int64_t j,
                                            const SdeSamplerOptions& options) {
  return RecomputeStep(schedule, predict, trajectory,
                       at::full({trajectory.timesteps.size(0)}, j, at::kLong), options);
}

absl::StatusOr<SdeStepResult> RecomputeStep(const SdeSchedule& schedule,
                                            const PredictVelocity& predict,
                                            const Trajectory& trajectory, const at::Tensor& steps,
                                            const SdeSamplerOptions& options) {
  const int64_t kept = trajectory.timesteps.size(1);
  if (steps.dim() != 1 || steps.size(0) != trajectory.timesteps.size(0) ||
      (steps.numel() > 0 &&
       (steps.min().item<int64_t>() < 0 || steps.max().item<int64_t>() >= kept))) {
    return absl::InvalidArgumentError(
        absl::StrCat("window steps must be one per row, each among the ", kept, " kept steps"));
  }
  const at::Tensor latents = AtSteps(trajectory.latents, steps);
  const at::Tensor timestep = AtSteps(trajectory.timesteps, steps);
  DRAY_ASSIGN_OR_RETURN(at::Tensor velocity, predict(latents, timestep));
  SdeStepInput input{velocity, timestep, latents, options.noise_level, options.type};
  input.prev_sample = AtSteps(trajectory.next_latents, steps);
  return SdeStep(schedule, input);
}

at::Tensor AtSteps(const at::Tensor& part, const at::Tensor& steps) {
  const at::Tensor index = steps.to(part.device(), at::kLong);
  return part.index({at::arange(part.size(0), index.options()), index});
}

}  // namespace dray::rl
