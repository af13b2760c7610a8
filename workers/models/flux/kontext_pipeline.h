// FluxKontextPipeline: an image and an instruction in, the edited image out,
// as diffusers computes it for FLUX.1 Kontext:
//
//   1. the output size: max_area pixels at the requested (or the input's)
//      aspect ratio, floored to 2 x the VAE's scale factor; the input image
//      is resized (Lanczos) to the nearest of Kontext's preferred
//      resolutions (auto_resize) or kept, floored likewise;
//   2. the instruction through CLIP (pooled) and T5 (per token), and the
//      negative prompt likewise when true CFG is on;
//   3. the input image VAE-encoded (mean, normalized, 2x2-packed): its
//      tokens follow the noisy ones, with position ids (1, row, column)
//      against the noise's (0, row, column);
//   4. from seeded Gaussian noise, denoise with the transformer (guidance
//      embedded, true CFG without rescaling when asked) stepping the
//      resolution-shifted flow-matching schedule (shift from the noise
//      tokens alone);
//   5. unpack, de-normalize and VAE-decode to an 8-bit RGB image.
//
//   DRAY_ASSIGN_OR_RETURN(FluxKontextModel model, LoadFluxKontextModel(dir, at::kFloat));
//   FluxKontextPipeline pipeline(std::move(model));
//   DRAY_ASSIGN_OR_RETURN(auto images, pipeline.Edit({{rgb, "add a red hat", /*seed=*/7}}, {}));
//
// Thread-safety: not thread-safe (the models are not).
#ifndef DRAY_WORKERS_MODELS_FLUX_KONTEXT_PIPELINE_H_
#define DRAY_WORKERS_MODELS_FLUX_KONTEXT_PIPELINE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "workers/models/flux/kontext_helpers.h"
#include "workers/models/flux/model.h"
#include "workers/models/qwen_image/scheduler.h"

namespace dray::flux {

// KontextEditInput: one row of an edit.
struct KontextEditInput {
  at::Tensor image;  // RGB, uint8 [H, W, 3]
  std::string instruction;
  uint64_t seed = 0;  // this row's noise
};

// TextConditioning: the transformer's text input for a batch.
struct TextConditioning {
  at::Tensor embeds;  // T5 states [B, L, joint_attention_dim]
  at::Tensor pooled;  // CLIP pooled [B, pooled_projection_dim]
};

// PreparedKontextEdit: rows of one input size, ready to denoise.
struct PreparedKontextEdit {
  at::Tensor noise;          // packed initial latents [B, S, C], each row's from its seed
  at::Tensor image_latents;  // packed, normalized VAE latents of the resized input [B, S', C]
  TextConditioning prompt;
  std::optional<TextConditioning> negative;  // set when true CFG runs
  at::Tensor img_ids;                        // [S + S', 3]
  at::Tensor txt_ids;                        // [L, 3]
  int64_t width = 0, height = 0;             // output pixels
};

// StepCallback: called after each denoising step with the steps done and
// the steps of the whole call; an error it returns ends the edit with it.
using KontextStepCallback = std::function<absl::Status(int step, int steps)>;

class FluxKontextPipeline {
 public:
  explicit FluxKontextPipeline(FluxKontextModel model);

  // Edit returns one uint8 [height, width, 3] image per input, in order.
  absl::StatusOr<std::vector<at::Tensor>> Edit(const std::vector<KontextEditInput>& inputs,
                                               const KontextOptions& options,
                                               const KontextStepCallback& on_step = nullptr);
  // EncodePrompts: CLIP pooled and T5 states of `prompts`.
  absl::StatusOr<TextConditioning> EncodePrompts(const std::vector<std::string>& prompts,
                                                 int64_t max_sequence_length);
  // Prepare resizes and encodes the rows (all of one input size) and draws
  // their noise; without gradients.
  absl::StatusOr<PreparedKontextEdit> Prepare(const std::vector<const KontextEditInput*>& rows,
                                              const KontextOptions& options);
  // PrepareLatents: the noise of `seeds` and the packed latents of
  // `pixels` ([B, 3, H, W] in [-1, 1], already resized) for an output of
  // height x width, with their position ids.
  absl::StatusOr<PreparedKontextEdit> PrepareLatents(const std::vector<uint64_t>& seeds,
                                                     const at::Tensor& pixels, int64_t height,
                                                     int64_t width);
  // EncodeImages turns uint8 [H, W, 3] images of one size into packed,
  // normalized latents [B, S, C] (the VAE's mean): what DecodeImages turns
  // back into them. Without gradients.
  absl::StatusOr<at::Tensor> EncodeImages(const std::vector<at::Tensor>& images);
  // Velocity: the transformer's prediction for the noisy tokens `latents`
  // at schedule timestep `timestep` ([B], 0..1000), with true CFG when the
  // prepared edit has a negative prompt. Differentiable in grad mode.
  absl::StatusOr<at::Tensor> Velocity(const PreparedKontextEdit& prepared,
                                      const at::Tensor& latents, const at::Tensor& timestep,
                                      double guidance_scale, double true_cfg_scale);
  // Prediction: one transformer pass for `text` (no CFG).
  absl::StatusOr<at::Tensor> Prediction(const PreparedKontextEdit& prepared,
                                        const TextConditioning& text, const at::Tensor& latents,
                                        const at::Tensor& timestep, double guidance_scale);
  // Scheduler: the shifted schedule of `steps` steps for `image_seq_len`
  // noisy latent tokens.
  absl::StatusOr<qwen_image::FlowMatchEulerScheduler> Scheduler(int64_t image_seq_len,
                                                                int steps) const;
  // DecodeLatents: packed latents to the VAE's output [B, 3, height, width]
  // (unclamped); DecodeImages to uint8 [height, width, 3] images.
  absl::StatusOr<at::Tensor> DecodeLatents(const at::Tensor& latents, int64_t height,
                                           int64_t width);
  absl::StatusOr<std::vector<at::Tensor>> DecodeImages(const at::Tensor& latents, int64_t height,
                                                       int64_t width);

  FluxKontextModel& model() { return model_; }
  // vae_scale_factor: pixels per latent along each side.
  int64_t vae_scale_factor() const { return model_.vae->config().spatial_compression(); }

 private:
  // EncodePixels: the packed, normalized latents of `pixels` ([B, 3, H, W]
  // in [-1, 1]), without gradients.
  absl::StatusOr<at::Tensor> EncodePixels(const at::Tensor& pixels);

  FluxKontextModel model_;
};

}  // namespace dray::flux

#endif  // DRAY_WORKERS_MODELS_FLUX_KONTEXT_PIPELINE_H_
