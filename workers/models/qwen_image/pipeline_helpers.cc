#include "workers/models/qwen_image/pipeline_helpers.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dray::qwen_image {

std::pair<int64_t, int64_t> CalculateDimensions(double target_area, double ratio) {
  const double width = std::sqrt(target_area * ratio);
  const double height = width / ratio;
  // std::nearbyint rounds half to even, as Python's round does.
  return {static_cast<int64_t>(std::nearbyint(width / 32)) * 32,
          static_cast<int64_t>(std::nearbyint(height / 32)) * 32};
}

std::pair<int64_t, int64_t> EditOutputSize(int64_t image_width, int64_t image_height,
                                           std::optional<int64_t> width,
                                           std::optional<int64_t> height, int64_t vae_scale_factor,
                                           double target_area) {
  const auto [default_width, default_height] = CalculateDimensions(
      target_area, static_cast<double>(image_width) / static_cast<double>(image_height));
  const int64_t multiple = 2 * vae_scale_factor;
  return {width.value_or(default_width) / multiple * multiple,
          height.value_or(default_height) / multiple * multiple};
}

at::Tensor SeededNoise(const std::vector<uint64_t>& seeds, at::IntArrayRef shape,
                       const at::TensorOptions& options) {
  std::vector<at::Tensor> noise;
  for (uint64_t seed : seeds) {
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    noise.push_back(at::randn(shape, generator, at::kFloat));
  }
  return at::cat(noise).to(options);
}

absl::StatusOr<at::Tensor> PackLatents(const at::Tensor& latents) {
  if (latents.dim() != 5 || latents.size(2) != 1 || latents.size(3) % 2 != 0 ||
      latents.size(4) % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PackLatents needs [B, C, 1, H, W] with even H and W, got [",
                     absl::StrJoin(latents.sizes(), ", "), "]"));
  }
  const int64_t b = latents.size(0), c = latents.size(1), h = latents.size(3), w = latents.size(4);
  return latents.reshape({b, c, h / 2, 2, w / 2, 2})
      .permute({0, 2, 4, 1, 3, 5})
      .reshape({b, (h / 2) * (w / 2), c * 4});
}

absl::StatusOr<at::Tensor> UnpackLatents(const at::Tensor& tokens, int64_t height, int64_t width,
                                         int64_t vae_scale_factor) {
  const int64_t h = 2 * (height / (vae_scale_factor * 2));
  const int64_t w = 2 * (width / (vae_scale_factor * 2));
  if (tokens.dim() != 3 || tokens.size(2) % 4 != 0 || tokens.size(1) != (h / 2) * (w / 2)) {
    return absl::InvalidArgumentError(
        absl::StrCat("UnpackLatents: tokens [", absl::StrJoin(tokens.sizes(), ", "),
                     "] do not tile a ", height, "x", width, " image at VAE scale ",
                     vae_scale_factor, " (expected ", (h / 2) * (w / 2), " tokens of 4C)"));
  }
  const int64_t b = tokens.size(0), c = tokens.size(2) / 4;
  return tokens.reshape({b, h / 2, w / 2, c, 2, 2})
      .permute({0, 3, 1, 4, 2, 5})
      .reshape({b, c, 1, h, w});
}

at::Tensor TrueCfg(const at::Tensor& cond, const at::Tensor& negative, double scale) {
  const at::Tensor combined = negative.add(cond.sub(negative).mul(scale));
  return combined.mul(cond.norm(2, {-1}, true).div(combined.norm(2, {-1}, true)));
}

}  // namespace dray::qwen_image
