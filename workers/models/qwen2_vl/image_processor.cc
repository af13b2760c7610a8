#include "workers/models/qwen2_vl/image_processor.h"

#include <ATen/ATen.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/shape_string.h"
#include "base/status_macros.h"
#include "workers/models/image_resize.h"

namespace dray::qwen2_vl {

absl::StatusOr<ImageProcessorConfig> ImageProcessorConfig::FromJson(JsonConfig json) {
  ImageProcessorConfig c;
  json.Ignore({"do_convert_rgb", "do_normalize", "do_rescale", "do_resize", "image_processor_type",
               "processor_class", "feature_extractor_type"});
  int64_t resample = 3;  // PIL.Image.BICUBIC
  DRAY_RETURN_IF_ERROR(json.Get("resample", &resample));
  if (resample != 3)
    return absl::UnimplementedError(
        absl::StrCat("resample ", resample, " is not supported (3, bicubic)"));
  DRAY_RETURN_IF_ERROR(json.Get("min_pixels", &c.min_pixels));
  DRAY_RETURN_IF_ERROR(json.Get("max_pixels", &c.max_pixels));
  DRAY_ASSIGN_OR_RETURN(JsonConfig size, json.Object("size"));
  DRAY_RETURN_IF_ERROR(size.Get("shortest_edge", &c.min_pixels));
  DRAY_RETURN_IF_ERROR(size.Get("longest_edge", &c.max_pixels));
  DRAY_RETURN_IF_ERROR(size.Finish());
  DRAY_RETURN_IF_ERROR(json.Get("patch_size", &c.patch_size));
  DRAY_RETURN_IF_ERROR(json.Get("merge_size", &c.merge_size));
  DRAY_RETURN_IF_ERROR(json.Get("temporal_patch_size", &c.temporal_patch_size));
  DRAY_RETURN_IF_ERROR(json.Get("rescale_factor", &c.rescale_factor));
  DRAY_RETURN_IF_ERROR(json.Get("image_mean", &c.image_mean));
  DRAY_RETURN_IF_ERROR(json.Get("image_std", &c.image_std));
  DRAY_RETURN_IF_ERROR(json.Finish());
  if (c.image_mean.size() != 3 || c.image_std.size() != 3 || c.patch_size < 1 || c.merge_size < 1 ||
      c.min_pixels < 1 || c.max_pixels < c.min_pixels) {
    return absl::InvalidArgumentError(
        "image processor: image_mean and image_std need 3 values, sizes must be "
        "positive and min_pixels <= max_pixels");
  }
  return c;
}

absl::StatusOr<ImageProcessorConfig> ImageProcessorConfig::FromFile(const std::string& path) {
  DRAY_ASSIGN_OR_RETURN(JsonConfig json, JsonConfig::ReadFile(path));
  return FromJson(std::move(json));
}

std::string ImageProcessorConfig::ToJson() const {
  return nlohmann::json{{"image_processor_type", "Qwen2VLImageProcessor"},
                        {"processor_class", "Qwen2_5_VLProcessor"},
                        {"do_convert_rgb", true},
                        {"do_normalize", true},
                        {"do_rescale", true},
                        {"do_resize", true},
                        {"resample", 3},
                        {"min_pixels", min_pixels},
                        {"max_pixels", max_pixels},
                        {"patch_size", patch_size},
                        {"merge_size", merge_size},
                        {"temporal_patch_size", temporal_patch_size},
                        {"rescale_factor", rescale_factor},
                        {"image_mean", image_mean},
                        {"image_std", image_std}}
      .dump(2);
}

absl::StatusOr<std::pair<int64_t, int64_t>> SmartResize(int64_t height, int64_t width,
                                                        const ImageProcessorConfig& config) {
  if (height < 1 || width < 1)
    return absl::InvalidArgumentError(absl::StrCat("image size ", width, "x", height, " is empty"));
  if (std::max(height, width) > 200 * std::min(height, width)) {
    return absl::InvalidArgumentError(
        absl::StrCat("image ", width, "x", height, ": aspect ratio must be under 200"));
  }
  const double factor = static_cast<double>(config.patch_size * config.merge_size);
  const double h = static_cast<double>(height), w = static_cast<double>(width);
  int64_t h_bar =
      static_cast<int64_t>(std::nearbyint(h / factor) * factor);  // Python's round: half to even
  int64_t w_bar = static_cast<int64_t>(std::nearbyint(w / factor) * factor);
  if (h_bar * w_bar > config.max_pixels) {
    const double beta = std::sqrt(h * w / static_cast<double>(config.max_pixels));
    h_bar = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(h / beta / factor) * factor));
    w_bar = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(w / beta / factor) * factor));
  } else if (h_bar * w_bar < config.min_pixels) {
    const double beta = std::sqrt(static_cast<double>(config.min_pixels) / (h * w));
    h_bar = static_cast<int64_t>(std::ceil(h * beta / factor) * factor);
    w_bar = static_cast<int64_t>(std::ceil(w * beta / factor) * factor);
  }
  return std::make_pair(h_bar, w_bar);
}

absl::StatusOr<ProcessedImage> ProcessImage(const at::Tensor& image,
                                            const ImageProcessorConfig& config) {
  if (image.dim() != 3 || image.size(2) != 3 || image.scalar_type() != at::kByte) {
    return absl::InvalidArgumentError(
        absl::StrCat("image processor: expected an RGB image uint8 [H, W, 3], got ",
                     c10::toString(image.scalar_type()), " ", ShapeString(image.sizes())));
  }
  DRAY_ASSIGN_OR_RETURN(auto size, SmartResize(image.size(0), image.size(1), config));
  const auto [height, width] = size;
  DRAY_ASSIGN_OR_RETURN(at::Tensor resized, ResizeImage(image, height, width, Resample::kBicubic));
  const at::Tensor mean = at::tensor(config.image_mean, at::kDouble).to(at::kFloat).view({3, 1, 1});
  const at::Tensor std = at::tensor(config.image_std, at::kDouble).to(at::kFloat).view({3, 1, 1});
  const at::Tensor pixels =
      ((resized.permute({2, 0, 1}).to(at::kDouble) * config.rescale_factor).to(at::kFloat) - mean) /
      std;  // [3, H, W]
  const int64_t p = config.patch_size, m = config.merge_size, t = config.temporal_patch_size;
  const int64_t grid_h = height / p, grid_w = width / p;
  // One image is one frame, repeated to fill a temporal patch.
  const at::Tensor frames = pixels.unsqueeze(0).expand({t, 3, height, width});
  const at::Tensor patches = frames.reshape({1, t, 3, grid_h / m, m, p, grid_w / m, m, p})
                                 .permute({0, 3, 6, 4, 7, 2, 1, 5, 8})
                                 .reshape({grid_h * grid_w, 3 * t * p * p});
  return ProcessedImage{patches.contiguous(), {1, grid_h, grid_w}};
}

}  // namespace dray::qwen2_vl
