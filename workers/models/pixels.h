// Conversions between 8-bit RGB images and the [-1, 1] pixels diffusion
// VAEs take and give, as diffusers' image processors make them (x / 127.5
// - 1 in, clamp and round out), shared by every model family.
//
//   at::Tensor pixels = ImagesToPixels({rgb}, vae_options);  // [1, 3, H, W]
//   std::vector<at::Tensor> images = PixelsToImages(vae->Decode(latents));
#ifndef DRAY_WORKERS_MODELS_PIXELS_H_
#define DRAY_WORKERS_MODELS_PIXELS_H_

#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"

namespace dray {

// ImagesToPixels maps uint8 [H, W, 3] images of one size to [B, 3, H, W]
// in [-1, 1], as `options` (dtype, device) says.
at::Tensor ImagesToPixels(const std::vector<at::Tensor>& images, const at::TensorOptions& options);

// PixelsToImages maps a VAE's output [B, 3, H, W] (about [-1, 1]) to uint8
// [H, W, 3] images on the CPU; INTERNAL where it holds NaN or infinity,
// which no byte stands for (a cast would give black or noise, silently).
absl::StatusOr<std::vector<at::Tensor>> PixelsToImages(const at::Tensor& decoded);

}  // namespace dray

#endif  // DRAY_WORKERS_MODELS_PIXELS_H_
