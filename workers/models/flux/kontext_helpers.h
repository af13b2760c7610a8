// Small functions of FluxKontextPipeline, exactly as diffusers defines
// them: the edit's options, the output and input sizes (Kontext's preferred
// resolutions), and the position ids of packed latents.
//
//   DRAY_ASSIGN_OR_RETURN(KontextSizes sizes, ComputeKontextSizes(w, h, KontextOptions{}, 8));
#ifndef DRAY_WORKERS_MODELS_FLUX_KONTEXT_HELPERS_H_
#define DRAY_WORKERS_MODELS_FLUX_KONTEXT_HELPERS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"

namespace dray::flux {

// kPreferredKontextResolutions: diffusers' PREFERRED_KONTEXT_RESOLUTIONS,
// {width, height}: the sizes FLUX.1 Kontext was trained at.
extern const std::vector<std::pair<int64_t, int64_t>> kPreferredKontextResolutions;

struct KontextOptions {
  int num_inference_steps = 28;
  double guidance_scale = 3.5;  // embedded (guidance-distilled), not CFG
  // True CFG runs only with a negative prompt and true_cfg_scale > 1.
  double true_cfg_scale = 1.0;
  std::optional<std::string> negative_prompt;
  // Output size: about max_area pixels at width / height's aspect ratio
  // (default: 1024 x 1024), floored to 2 x the VAE scale factor.
  std::optional<int64_t> width, height;
  int64_t max_area = 1024 * 1024;
  // Resize the input image to the nearest preferred resolution (scaled to
  // max_area pixels: diffusers' at its default 1024^2).
  bool auto_resize = true;
  int64_t max_sequence_length = 512;  // T5 tokens
};

// KontextSizes: the output's pixels and what the input image is resized to.
struct KontextSizes {
  int64_t width = 0, height = 0;
  int64_t image_width = 0, image_height = 0;
};

// ComputeKontextSizes: the sizes of an edit of an image_width x
// image_height input under `options`; INVALID_ARGUMENT when one is smaller
// than a latent token.
absl::StatusOr<KontextSizes> ComputeKontextSizes(int64_t image_width, int64_t image_height,
                                                 const KontextOptions& options,
                                                 int64_t vae_scale_factor);

// LatentImageIds: the position ids [rows * columns, 3] of a packed latent
// grid: (index, row, column), float32.
at::Tensor LatentImageIds(int64_t rows, int64_t columns, int64_t index);

}  // namespace dray::flux

#endif  // DRAY_WORKERS_MODELS_FLUX_KONTEXT_HELPERS_H_
