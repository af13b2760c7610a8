#include "workers/train/sft.h"

#include <ATen/ATen.h>

#include "base/status_macros.h"
#include "workers/models/image_resize.h"
#include "workers/models/layers.h"

namespace dray {

SftNoising SftNoise(const qwen_image::FlowMatchEulerScheduler& schedule, const at::Tensor& draws,
                    const at::Tensor& latents, const at::Tensor& noise) {
  const int64_t steps = schedule.timesteps().size(0);
  const at::Tensor index = (draws.to(at::kCPU, at::kDouble) * static_cast<double>(steps))
                               .floor()
                               .to(at::kLong)
                               .clamp(0, steps - 1);
  SftNoising out;
  out.timesteps = schedule.timesteps().index_select(0, index).to(latents.device(), at::kFloat);
  const at::Tensor sigma =
      schedule.sigmas().index_select(0, index).to(latents.device(), at::kFloat).view({-1, 1, 1});
  const at::Tensor x0 = AtLeastFloat32(latents), epsilon = AtLeastFloat32(noise);
  out.noisy = ((1 - sigma) * x0 + sigma * epsilon).to(latents.scalar_type());
  out.target = epsilon - x0;
  return out;
}

absl::StatusOr<at::Tensor> SftTargetLatents(EditDiffusion& diffusion,
                                            const std::vector<at::Tensor>& targets,
                                            const PreparedRows& prepared) {
  std::vector<at::Tensor> resized;
  for (const at::Tensor& target : targets) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor image, ResizeImage(target, prepared.height(), prepared.width(),
                                                        Resample::kLanczos));
    resized.push_back(image);
  }
  return diffusion.EncodeImages(resized);
}

}  // namespace dray
