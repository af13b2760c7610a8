// Supervised fine-tuning's flow-matching numerics, as Qwen-Image-Edit and
// FLUX.1 Kontext fine-tunes compute them (diffusers' training scripts): the target image's
// latents x0, noise at a sigma drawn from the shifted schedule,
//
//   noisy = (1 - sigma) x0 + sigma noise,   target velocity = noise - x0,
//
// and the mean squared error of the transformer's velocity at the noisy
// latents, with the condition image's latents beside them as the edit
// pipeline has them.
//
//   DRAY_ASSIGN_OR_RETURN(at::Tensor x0, SftTargetLatents(diffusion, targets, prepared));
//   const SftNoising noising = SftNoise(schedule, draws, x0, prepared.noise());
//   loss = mse(diffusion.Velocity(prepared, noising.noisy, noising.timesteps, 1.0), noising.target)
#ifndef DRAY_WORKERS_TRAIN_SFT_H_
#define DRAY_WORKERS_TRAIN_SFT_H_

#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "workers/models/qwen_image/scheduler.h"
#include "workers/pipeline/edit_diffusion.h"

namespace dray {

struct SftNoising {
  at::Tensor timesteps;  // [B], the transformer's 0..1000 scale
  at::Tensor noisy;      // [B, S, C]
  at::Tensor target;     // [B, S, C] float32: noise - x0
};

// SftNoise noises row b of `latents` with row b of `noise` at the sigma its
// draw u_b in [0, 1) picks from `schedule` (timestep index floor(u_b x
// steps), as diffusers' training scripts index the scheduler's timesteps).
SftNoising SftNoise(const qwen_image::FlowMatchEulerScheduler& schedule, const at::Tensor& draws,
                    const at::Tensor& latents, const at::Tensor& noise);

// SftTargetLatents resizes `targets` (uint8 [H, W, 3]) to the prepared
// rows' output size (Lanczos) and encodes them as the model encodes
// images: the latents the edit should end at.
absl::StatusOr<at::Tensor> SftTargetLatents(EditDiffusion& diffusion,
                                            const std::vector<at::Tensor>& targets,
                                            const PreparedRows& prepared);

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_SFT_H_
