// DiffusionNFT's deterministic rollout samplers (NVlabs/DiffusionNFT,
// flow_grpo/diffusers_patch/solver.py::run_sampling with determistic=True):
// DiffusionNFT trains on clean latents, so its rollouts need no SDE and no
// log-probabilities, only a good ODE solver in few steps.
//
//   flow  Euler: x <- x + (sigma_{i+1} - sigma_i) v
//   dpm2  DPM-Solver++(2M) on the flow's x0 prediction x - sigma v (its
//         default): a DDIM step first and last, second order between,
//         with lambda = log((1 - sigma) / sigma)
//
//   DRAY_ASSIGN_OR_RETURN(at::Tensor clean, SampleOde(schedule, noise, predict, OdeSolver::kDpm2));
//
// Thread-safety: pure functions (the callbacks are called on this thread).
#ifndef DRAY_WORKERS_RL_ODE_SAMPLER_H_
#define DRAY_WORKERS_RL_ODE_SAMPLER_H_

#include <functional>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "workers/rl/sde_sampler.h"

namespace dray::rl {

enum class OdeSolver { kFlow, kDpm2 };

// ParseOdeSolver reads "flow" or "dpm2".
absl::StatusOr<OdeSolver> ParseOdeSolver(absl::string_view name);

// SampleOde denoises `latents` over the whole schedule without gradients
// and returns the final latents (float32). `on_step` (optional) is called
// after each step with (steps done, steps); its error ends the loop.
absl::StatusOr<at::Tensor> SampleOde(
    const SdeSchedule& schedule, at::Tensor latents, const PredictVelocity& predict,
    OdeSolver solver, const std::function<absl::Status(int step, int steps)>& on_step = nullptr);

}  // namespace dray::rl

#endif  // DRAY_WORKERS_RL_ODE_SAMPLER_H_
