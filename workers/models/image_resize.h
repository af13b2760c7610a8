// ResizeImage: Pillow's Image.resize for 8-bit RGB images, bit for bit:
// separable convolution (horizontal pass, then vertical) with the filter
// widened by the scale when shrinking (antialiasing), 22-bit fixed-point
// weights, and rounding to 8 bits after each pass. diffusers' and
// transformers' image processors resize with Pillow, so matching it keeps
// the pipeline's inputs identical to theirs.
//
//   DRAY_ASSIGN_OR_RETURN(at::Tensor small, ResizeImage(image, 512, 384, Resample::kLanczos));
#ifndef DRAY_WORKERS_MODELS_IMAGE_RESIZE_H_
#define DRAY_WORKERS_MODELS_IMAGE_RESIZE_H_

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"

namespace dray {

enum class Resample {
  kBicubic,  // PIL.Image.BICUBIC (a = -0.5)
  kLanczos,  // PIL.Image.LANCZOS (3 lobes)
};

// ResizeImage resizes `image` (uint8 [H, W, C]) to height x width.
absl::StatusOr<at::Tensor> ResizeImage(const at::Tensor& image, int64_t height, int64_t width,
                                       Resample resample);

}  // namespace dray

#endif  // DRAY_WORKERS_MODELS_IMAGE_RESIZE_H_
