// Qwen2VLImageProcessor: how Qwen2.5-VL sees an image. The image is resized
// (bicubic) so each side is a multiple of patch x merge (28 px) and its area
// lies within [min_pixels, max_pixels]; scaled to [0, 1], normalized with
// CLIP's mean and std, duplicated to two frames, and cut into 14x14x2
// patches ordered so each 2x2 merge group is contiguous. The prompt's one
// <|image_pad|> then stands for grid_h * grid_w / 4 tokens.
//
//   DRAY_ASSIGN_OR_RETURN(auto config,
//   ImageProcessorConfig::FromFile("processor/preprocessor_config.json"));
//   DRAY_ASSIGN_OR_RETURN(ProcessedImage processed, ProcessImage(rgb, config));
//   int64_t tokens = processed.tokens(config);
#ifndef DRAY_WORKERS_MODELS_QWEN2_VL_IMAGE_PROCESSOR_H_
#define DRAY_WORKERS_MODELS_QWEN2_VL_IMAGE_PROCESSOR_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "workers/models/json_config.h"
#include "workers/models/qwen2_vl/text_encoder.h"

namespace dray::qwen2_vl {

// ImageProcessorConfig: preprocessor_config.json; defaults are Qwen2.5-VL's.
struct ImageProcessorConfig {
  int64_t min_pixels = 56 * 56;
  int64_t max_pixels = 28 * 28 * 16384;  // 12,845,056
  int64_t patch_size = 14;
  int64_t merge_size = 2;
  int64_t temporal_patch_size = 2;
  double rescale_factor = 1.0 / 255;
  std::vector<double> image_mean = {0.48145466, 0.4578275, 0.40821073};
  std::vector<double> image_std = {0.26862954, 0.26130258, 0.27577711};

  static absl::StatusOr<ImageProcessorConfig> FromJson(JsonConfig json);
  static absl::StatusOr<ImageProcessorConfig> FromFile(const std::string& path);
  std::string ToJson() const;
};

// SmartResize returns the {height, width} the processor resizes to:
// multiples of patch x merge, area within [min_pixels, max_pixels], aspect
// ratio kept as nearly as possible. An aspect ratio beyond 200 is an error.
absl::StatusOr<std::pair<int64_t, int64_t>> SmartResize(int64_t height, int64_t width,
                                                        const ImageProcessorConfig& config);

struct ProcessedImage {
  at::Tensor patches;  // float32 [grid t * h * w, 3 * temporal * patch * patch]
  ImageGrid grid;      // (t, h, w) in patches
  // tokens: how many <|image_pad|> tokens the image becomes.
  int64_t tokens(const ImageProcessorConfig& config) const {
    return grid[0] * grid[1] * grid[2] / (config.merge_size * config.merge_size);
  }
};

// ProcessImage turns an RGB image (uint8 [H, W, 3]) into patches.
absl::StatusOr<ProcessedImage> ProcessImage(const at::Tensor& image,
                                            const ImageProcessorConfig& config);

}  // namespace dray::qwen2_vl

#endif  // DRAY_WORKERS_MODELS_QWEN2_VL_IMAGE_PROCESSOR_H_
