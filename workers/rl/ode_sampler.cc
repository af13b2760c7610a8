#include "workers/rl/ode_sampler.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace dray::rl {
namespace {

// The steps below follow solver.py's operations one by one: float32
// tensors, coefficients computed in float64 (its sigmas.to(float64)) and
// applied as float32 scalars, as PyTorch applies a 0-dim float64 tensor.

// EulerStep: flow_grpo_step with eta 0.
at::Tensor EulerStep(const at::Tensor& x, const at::Tensor& v, double s, double t) {
  const float dt = static_cast<float>(t) - static_cast<float>(s);  // float32 sigmas
  return x + v * dt;
}

// DdimStep: ddim_update with eta 0 on the x0 prediction.
at::Tensor DdimStep(const at::Tensor& x, const at::Tensor& x0, double s, double t) {
  const at::Tensor noise_prediction = (x - x0 * (1 - s)) / s;
  return x0 * (1 - t) + noise_prediction * std::sqrt(t * t);  // upstream's sqrt(t^2 - rho^2), rho 0
}

// Lambda: the log signal-to-noise ratio log(alpha / sigma) of a flow's sigma.
double Lambda(double sigma) { return std::log(1 - sigma) - std::log(sigma); }

// SecondOrderStep: multistep_dpm_solver_second_order_update from s0 to t,
// with the previous step's sigma s1 and x0 predictions x0 (at s0) and
// previous_x0 (at s1).
at::Tensor SecondOrderStep(const at::Tensor& x, const at::Tensor& x0, const at::Tensor& previous_x0,
                           double s1, double s0, double t) {
  const double h = Lambda(t) - Lambda(s0);
  const double r0 = (Lambda(s0) - Lambda(s1)) / h;  // s1 = 1: infinite, no correction
  const at::Tensor d1 = (x0 - previous_x0) * (1.0 / r0);
  const double c = (1 - t) * (std::exp(-h) - 1.0);
  return x * (t / s0) - x0 * c - d1 * (0.5 * c);
}

}  // namespace

absl::StatusOr<OdeSolver> ParseOdeSolver(absl::string_view name) {
  if (name == "flow") return OdeSolver::kFlow;
  if (name == "dpm2") return OdeSolver::kDpm2;
  return absl::InvalidArgumentError(absl::StrCat("unknown ODE solver '", name, "' (flow or dpm2)"));
}

absl::StatusOr<at::Tensor> SampleOde(
    const SdeSchedule& schedule, at::Tensor latents, const PredictVelocity& predict,
    OdeSolver solver, const std::function<absl::Status(int step, int steps)>& on_step) {
  const int steps = static_cast<int>(schedule.timesteps.size(0));
  if (schedule.sigmas.dim() != 1 || schedule.sigmas.size(0) != steps + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a schedule of ", steps, " steps needs ", steps + 1, " sigmas"));
  }
  at::NoGradGuard no_grad;
  const at::Tensor sigma_values = schedule.sigmas.to(at::kCPU, at::kDouble).contiguous();
  const std::vector<double> sigmas(sigma_values.data_ptr<double>(),
                                   sigma_values.data_ptr<double>() + steps + 1);
  const int64_t batch = latents.size(0);
  latents = latents.to(at::kFloat);
  at::Tensor previous_x0;
  for (int i = 0; i < steps; ++i) {
    const at::Tensor timestep = schedule.timesteps[i].expand({batch}).contiguous();
    DRAY_ASSIGN_OR_RETURN(at::Tensor velocity, predict(latents, timestep));
    velocity = velocity.to(at::kFloat);
    const double s = sigmas[i], t = sigmas[i + 1];
    if (solver == OdeSolver::kFlow) {
      latents = EulerStep(latents, velocity, s, t);
    } else {
      const at::Tensor x0 = latents - velocity * static_cast<float>(s);
      latents = i == 0 || i == steps - 1
                    ? DdimStep(latents, x0, s, t)
                    : SecondOrderStep(latents, x0, previous_x0, sigmas[i - 1], s, t);
      previous_x0 = x0;
    }
    if (on_step) DRAY_RETURN_IF_ERROR(on_step(i + 1, steps));
  }
  return latents;
}

}  // namespace dray::rl
