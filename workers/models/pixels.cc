#include "workers/models/pixels.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "workers/models/layers.h"

namespace dray {

at::Tensor ImagesToPixels(const std::vector<at::Tensor>& images, const at::TensorOptions& options) {
  const at::Tensor unit = at::stack(images).permute({0, 3, 1, 2}).to(at::kFloat) / 255.0;
  return (unit * 2 - 1).to(options);
}

absl::StatusOr<std::vector<at::Tensor>> PixelsToImages(const at::Tensor& decoded) {
  const at::Tensor pixels = AtLeastFloat32(decoded.cpu());
  if (const int64_t bad = pixels.numel() - at::isfinite(pixels).sum().item<int64_t>(); bad > 0) {
    return absl::InternalError(absl::StrCat(
        "the VAE decoded ", bad, " of ", pixels.numel(),
        " values as NaN or infinity: the weights or latents are not finite, float16 or bfloat16 "
        "overflowed, or the CPU's convolution kernels went wrong (docs/building.md, LibTorch 2)"));
  }
  const at::Tensor unit = (pixels / 2 + 0.5).clamp(0, 1);
  const at::Tensor bytes = (unit * 255).round().to(at::kByte).permute({0, 2, 3, 1});
  std::vector<at::Tensor> images;
  for (int64_t i = 0; i < bytes.size(0); ++i) images.push_back(bytes[i].contiguous());
  return images;
}

}  // namespace dray
