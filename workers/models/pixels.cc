#include "workers/models/pixels.h"

#include <ATen/ATen.h>

#include "workers/models/layers.h"

namespace dray {

at::Tensor ImagesToPixels(const std::vector<at::Tensor>& images, const at::TensorOptions& options) {
  const at::Tensor unit = at::stack(images).permute({0, 3, 1, 2}).to(at::kFloat) / 255.0;
  return (unit * 2 - 1).to(options);
}

std::vector<at::Tensor> PixelsToImages(const at::Tensor& decoded) {
  const at::Tensor unit = (AtLeastFloat32(decoded.cpu()) / 2 + 0.5).clamp(0, 1);
  const at::Tensor bytes = (unit * 255).round().to(at::kByte).permute({0, 2, 3, 1});
  std::vector<at::Tensor> images;
  for (int64_t i = 0; i < bytes.size(0); ++i) images.push_back(bytes[i].contiguous());
  return images;
}

}  // namespace dray
