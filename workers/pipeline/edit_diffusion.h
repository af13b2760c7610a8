// EditDiffusion: an edit model's denoising as training drives it, whatever
// the model's family (Qwen-Image-Edit, FLUX.1 Kontext): prepare rows
// (encode instruction and image, draw each row's noise), predict the
// velocity of noisy latents, the family's schedule, and encode and decode
// images. The training worker's algorithms (SFT, the GRPO family,
// DiffusionNFT, DPO) are written once against it.
//
//   EditDiffusion diffusion(*model);
//   DRAY_ASSIGN_OR_RETURN(PreparedRows prepared, diffusion.Prepare(rows, options, &cache));
//   DRAY_ASSIGN_OR_RETURN(auto schedule, diffusion.Scheduler(prepared.noise().size(1), steps));
//   DRAY_ASSIGN_OR_RETURN(at::Tensor v, diffusion.Velocity(prepared, latents, t, cfg_scale));
//
// FLUX.1 Kontext runs with its embedded guidance (the model config's
// guidance_scale) and max_prompt_tokens T5 tokens; it has no condition
// cache (each Prepare encodes its rows) and no stand-in denoisers (frozen
// reference copies, DMD2's scores): the worker refuses those jobs up front.
//
// Thread-safety: not thread-safe (the models are not).
#ifndef DRAY_WORKERS_PIPELINE_EDIT_DIFFUSION_H_
#define DRAY_WORKERS_PIPELINE_EDIT_DIFFUSION_H_

#include <cstdint>
#include <variant>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "workers/models/flux/kontext_pipeline.h"
#include "workers/models/qwen_image/edit_pipeline.h"
#include "workers/pipeline/edit_model.h"

namespace dray {

// PreparedRows: rows of one input size ready to denoise, by either family.
class PreparedRows {
 public:
  // noise: the packed initial latents [B, S, C], each row's from its seed.
  const at::Tensor& noise() const;
  // The output's pixels.
  int64_t height() const;
  int64_t width() const;
  // DropGuidance: the rows without their negative prompt (one pass a step).
  void DropGuidance();

 private:
  friend class EditDiffusion;
  using Family = std::variant<qwen_image::PreparedEdit, flux::PreparedKontextEdit>;
  explicit PreparedRows(Family edit) : edit_(std::move(edit)) {}

  Family edit_;
};

class EditDiffusion {
 public:
  // `model` must outlive this.
  explicit EditDiffusion(EditModel& model) : model_(model) {}

  // Prepare resizes and encodes `rows`, which must share their input
  // images' sizes (INVALID_ARGUMENT otherwise: sharded ranks run in step),
  // and draws their noise, without gradients. Qwen-Image keeps what it
  // encodes in `cache` (may be null) and reuses it.
  absl::StatusOr<PreparedRows> Prepare(const std::vector<qwen_image::EditInput>& rows,
                                       const qwen_image::EditOptions& options,
                                       qwen_image::ConditionCache* cache);

  // Velocity: the transformer's prediction for `latents` at schedule
  // timesteps `timestep` ([B], 0..1000), with true CFG when the rows keep a
  // negative prompt. Differentiable in grad mode. `denoiser` stands in for
  // the model's transformer (Qwen-Image only: UNIMPLEMENTED for Kontext).
  absl::StatusOr<at::Tensor> Velocity(const PreparedRows& prepared, const at::Tensor& latents,
                                      const at::Tensor& timestep, double true_cfg_scale,
                                      const qwen_image::Denoiser& denoiser = nullptr);

  // Scheduler: the family's shifted schedule of `steps` steps for
  // `image_seq_len` noisy latent tokens.
  absl::StatusOr<qwen_image::FlowMatchEulerScheduler> Scheduler(int64_t image_seq_len,
                                                                int steps) const;

  // EncodeImages: uint8 [H, W, 3] images of one size as packed, normalized
  // latents [B, S, C] (what Decode turns back into images).
  absl::StatusOr<at::Tensor> EncodeImages(const std::vector<at::Tensor>& images);

  // Decode: packed latents to uint8 [height, width, 3] images.
  absl::StatusOr<std::vector<at::Tensor>> Decode(const at::Tensor& latents, int64_t height,
                                                 int64_t width);

  // Edit: one uint8 image per row, as the family's pipeline edits it.
  absl::StatusOr<std::vector<at::Tensor>> Edit(const std::vector<qwen_image::EditInput>& rows,
                                               const qwen_image::EditOptions& options);

 private:
  bool kontext() const { return model_.family == ModelFamily::kFluxKontext; }
  // KontextRows: `rows` as Kontext's (their first image each).
  static std::vector<flux::KontextEditInput> KontextRows(
      const std::vector<qwen_image::EditInput>& rows);
  flux::KontextOptions KontextOptions(const qwen_image::EditOptions& options,
                                      const at::Tensor& image) const;

  EditModel& model_;
};

}  // namespace dray

#endif  // DRAY_WORKERS_PIPELINE_EDIT_DIFFUSION_H_
