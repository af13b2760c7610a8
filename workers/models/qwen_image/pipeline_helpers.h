// Small functions of the Qwen-Image-Edit pipeline, exactly as diffusers
// defines them: output size for a target area, and the 2x2 packing of VAE
// latents into transformer tokens (and back), and true classifier-free guidance.
#ifndef DRAY_WORKERS_MODELS_QWEN_IMAGE_PIPELINE_HELPERS_H_
#define DRAY_WORKERS_MODELS_QWEN_IMAGE_PIPELINE_HELPERS_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"

namespace dray::qwen_image {

// CalculateDimensions returns {width, height}: the target area at aspect
// `ratio` (width / height), each rounded to a multiple of 32 with Python's
// round-half-to-even.
std::pair<int64_t, int64_t> CalculateDimensions(double target_area, double ratio);

// EditOutputSize returns the {width, height} QwenImageEditPipeline renders
// for an input image of image_width x image_height: the requested size, or
// else CalculateDimensions(target_area, image_width / image_height), each
// floored to a multiple of 2 * vae_scale_factor (one packed latent token).
// diffusers' target area is 1024 * 1024.
std::pair<int64_t, int64_t> EditOutputSize(int64_t image_width, int64_t image_height,
                                           std::optional<int64_t> width,
                                           std::optional<int64_t> height, int64_t vae_scale_factor,
                                           double target_area = 1024.0 * 1024.0);

// SeededNoise: a standard normal draw of `shape` (one row's, with its
// batch dimension of 1) for each seed, as torch.randn with a CPU generator
// seeded so, concatenated and put where `options` say (a row's noise does
// not depend on the device or on which rows share its batch).
at::Tensor SeededNoise(const std::vector<uint64_t>& seeds, at::IntArrayRef shape,
                       const at::TensorOptions& options);

// PackLatents turns latents [B, C, 1, H, W] (H, W even) into tokens
// [B, (H/2)(W/2), 4C], each token a 2x2 patch in channel-major order.
absl::StatusOr<at::Tensor> PackLatents(const at::Tensor& latents);

// UnpackLatents inverts PackLatents for an image of height x width pixels:
// tokens [B, S, 4C] -> [B, C, 1, H, W] with H = 2 * (height / (2 * vae_scale_factor)).
absl::StatusOr<at::Tensor> UnpackLatents(const at::Tensor& tokens, int64_t height, int64_t width,
                                         int64_t vae_scale_factor);

// TrueCfg is diffusers' true classifier-free guidance with norm rescale:
// negative + scale * (cond - negative), each token rescaled to the norm of
// the conditional prediction (norms over the last dimension).
at::Tensor TrueCfg(const at::Tensor& cond, const at::Tensor& negative, double scale);

}  // namespace dray::qwen_image

#endif  // DRAY_WORKERS_MODELS_QWEN_IMAGE_PIPELINE_HELPERS_H_
