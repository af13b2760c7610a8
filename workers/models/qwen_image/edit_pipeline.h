// QwenImageEditPipeline: images and an instruction in, the edited image
// out, as diffusers computes it with the pipeline the model directory names
// (model.h's EditPipelineKind): QwenImageEditPipeline (Qwen-Image-Edit, one
// input image) or QwenImageEditPlusPipeline (Qwen-Image-Edit-2509 and
// -2511, one to three):
//
//   1. resize each input, keeping its aspect ratio, for the text encoder
//      (Edit-Plus: to about condition_image_size^2 pixels; Edit: to about
//      image_size^2) and for the VAE (about image_size^2), Lanczos;
//   2. encode the instruction with Qwen2.5-VL, which also sees the images
//      (the edit chat template, Edit-Plus naming them "Picture N: "; the
//      first template tokens' states dropped); the negative prompt, with
//      the same images, likewise when classifier-free guidance is on;
//   3. VAE-encode each resized image (mode, normalized, 2x2-packed), the
//      images' tokens one after another;
//   4. from seeded Gaussian noise, denoise with the transformer over
//      [noisy tokens, image tokens], with true CFG (rescaled to the
//      conditional prediction's norm) when true_cfg_scale > 1 and a
//      negative prompt is given, stepping the shifted flow-matching schedule;
//   5. unpack, de-normalize and VAE-decode to an 8-bit RGB image of about
//      image_size^2 pixels at the last input's aspect ratio (or the size
//      asked for).
//
//   DRAY_ASSIGN_OR_RETURN(QwenImageModel model, LoadQwenImageModel(dir, at::kFloat));
//   QwenImageEditPipeline pipeline(std::move(model));
//   DRAY_ASSIGN_OR_RETURN(auto images, pipeline.Edit({{{rgb}, "make the sky green", /*seed=*/7}},
//   options));
//
// Each row's noise comes from its own seed, so a row's result does not
// depend on which rows share its batch. Rows whose images have the same
// sizes are denoised together as one batch (SameSizeGroups).
//
// Thread-safety: not thread-safe (the models are not).
#ifndef DRAY_WORKERS_MODELS_QWEN_IMAGE_EDIT_PIPELINE_H_
#define DRAY_WORKERS_MODELS_QWEN_IMAGE_EDIT_PIPELINE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "runtime/collectives/communicator.h"
#include "workers/models/qwen_image/model.h"
#include "workers/models/qwen_image/scheduler.h"
#include "workers/models/qwen_image/step_cache.h"

namespace dray::qwen_image {

// kMaxEditPlusImages: the most input images an Edit-Plus edit takes (Qwen's
// 2509 and 2511 are made for one to three).
inline constexpr int kMaxEditPlusImages = 3;

struct EditInput {
  std::vector<at::Tensor> images;  // RGB, uint8 [H, W, 3]; Qwen-Image-Edit takes one
  std::string instruction;
  uint64_t seed = 0;  // this row's noise
};

struct EditOptions {
  int num_inference_steps = 50;
  double true_cfg_scale = 4.0;
  // Guidance runs only with a negative prompt and true_cfg_scale > 1
  // (diffusers: " " is a common negative prompt).
  std::optional<std::string> negative_prompt;
  // The inputs are resized to about image_size^2 pixels (diffusers: 1024)
  // for the VAE, and the output is about as large.
  int64_t image_size = 1024;
  // Edit-Plus: the inputs are resized to about condition_image_size^2
  // pixels for the text encoder (diffusers: 384).
  int64_t condition_image_size = 384;
  // Output size; each defaults to the resized input's, and is floored to a
  // multiple of 2 x the VAE's scale factor.
  std::optional<int64_t> width, height;
  // First-block caching of the denoising loop's passes (threshold 0: off,
  // the exact result).
  StepCacheOptions step_cache;
};

// EditPasses: how many transformer passes a denoising loop ran with a step
// cache, and how many of them reused the blocks after the first.
struct EditPasses {
  int passes = 0;
  int reused = 0;
};

// StepCallback: called after each denoising step, with the steps done and
// the steps of the whole call (every loop's; see DenoisingLoops). An error
// it returns ends the edit with that error (a caller's cancellation).
using StepCallback = std::function<absl::Status(int step, int steps)>;

// DenoisingLoops: how many denoising loops an Edit of `inputs` runs: one per
// distinct list of input image sizes, each of num_inference_steps steps.
int64_t DenoisingLoops(const std::vector<EditInput>& inputs);

// ToPixels maps uint8 [H, W, 3] images of one size to the VAE's input
// [B, 3, 1, H, W] in [-1, 1] (pixels.h's, with the frame axis).
at::Tensor ToPixels(const std::vector<at::Tensor>& images, const at::TensorOptions& options);

// EncodeEditPrompt tokenizes the edit template of `kind` for `images` input
// images around `instruction`. The template's control tokens are matched;
// the instruction is plain text (a "<|im_end|>" a user types is those ten
// characters, not the end of the turn). For an instruction without control
// tokens the ids equal what transformers' tokenizer gives for the whole
// templated string.
std::vector<int64_t> EncodeEditPrompt(const BpeTokenizer& tokenizer, absl::string_view instruction,
                                      EditPipelineKind kind = EditPipelineKind::kEdit,
                                      int images = 1);

// ExpandImagePads returns `ids` with its i-th <|image_pad|> (`image_pad_id`)
// repeated image_tokens[i] times, as Qwen2-VL's processor expands it;
// INVALID_ARGUMENT unless there is one placeholder per image.
absl::StatusOr<std::vector<int64_t>> ExpandImagePads(const std::vector<int64_t>& ids,
                                                     int64_t image_pad_id,
                                                     const std::vector<int64_t>& image_tokens);

// EditSizes: what an edit resizes each input image to, as {width, height},
// for the text encoder and for the VAE, and the output's pixels.
struct EditSizes {
  std::vector<std::pair<int64_t, int64_t>> prompt, vae;
  int64_t width = 0, height = 0;
};

// ComputeEditSizes: the sizes of an edit of `images` (uint8 [H, W, 3]) by
// a pipeline of `kind`; INVALID_ARGUMENT when one would be smaller than a
// latent token.
absl::StatusOr<EditSizes> ComputeEditSizes(const std::vector<at::Tensor>& images,
                                           const EditOptions& options, EditPipelineKind kind,
                                           int64_t vae_scale_factor);

// PromptEmbeddings: the transformer's text input for a batch.
struct PromptEmbeddings {
  at::Tensor embeds;  // [B, L, hidden], zero past each prompt's end
  at::Tensor mask;    // int64 [B, L]: 1 for real tokens
};

// Denoiser: what Velocity asks for each prompt side: the transformer's
// output for `hidden` ([B, S + S_cond, C]: the latents, then the pictures'
// latents) under `text` at `timestep` ([B], 0..1), `shapes` each row's
// token grids (QwenImageTransformerImpl::forward's arguments).
using Denoiser = std::function<absl::StatusOr<at::Tensor>(
    const at::Tensor& hidden, const PromptEmbeddings& text, const at::Tensor& timestep,
    const std::vector<SampleImages>& shapes)>;

// DenoiserOf: `transformer` as a Denoiser (it must outlive the result).
Denoiser DenoiserOf(QwenImageTransformerImpl& transformer);

// PreparedEdit: rows sharing their image sizes, ready to denoise: what the
// edit loop and an RL rollout (or its training step) start from.
struct PreparedEdit {
  at::Tensor noise;          // packed initial latents [B, S, C], each row's from its seed
  at::Tensor image_latents;  // packed, normalized VAE latents of the resized inputs, in order
  PromptEmbeddings prompt;
  std::optional<PromptEmbeddings> negative;  // set when guidance runs
  std::vector<SampleImages> shapes;
  int64_t width = 0, height = 0;  // output pixels
};

// ConditionCache keeps what Prepare encodes of each row (its instruction
// with its image through the text encoder, the negative prompt's states,
// the image's VAE latents), so that preparing the same rows again under the
// same options (an RL update after its rollout) encodes nothing twice.
// Entries match on instruction and image pixels; options other than the
// cache's (image sizes, guidance) clear it.
class ConditionCache {
 public:
  void Clear() { entries_.clear(); }
  size_t size() const { return entries_.size(); }

 private:
  friend class QwenImageEditPipeline;
  struct Entry {
    std::string instruction;
    std::vector<at::Tensor> images;  // the row's inputs, to match on
    at::Tensor embeds;               // [tokens, hidden]: no padding
    at::Tensor negative;             // the same for the negative prompt, when guidance runs
    at::Tensor latents;              // [S, C], packed
  };
  std::string options_;  // what the entries were encoded under
  std::vector<Entry> entries_;
};

// CheckPictureCount: whether a row of `images` input images asking
// `instruction` suits a pipeline of `kind` (Edit: one image; Edit-Plus: one
// to kMaxEditPlusImages, and the instruction names no picture beyond them):
// INVALID_ARGUMENT saying why.
absl::Status CheckPictureCount(size_t images, absl::string_view instruction, EditPipelineKind kind);

// SameSizeGroups returns the indices of `inputs` grouped by their images'
// sizes (each group one denoising loop), after checking every row for a
// pipeline of `kind` and `options`: INVALID_ARGUMENT naming the row for a
// wrong number of images, an image that is not RGB uint8 of at least 1x1,
// or (Edit-Plus) an instruction naming a picture it was not given.
absl::StatusOr<std::vector<std::vector<size_t>>> SameSizeGroups(
    const std::vector<EditInput>& inputs, const EditOptions& options,
    EditPipelineKind kind = EditPipelineKind::kEdit);

class QwenImageEditPipeline {
 public:
  explicit QwenImageEditPipeline(QwenImageModel model);

  // EncodePrompts encodes each instruction with its images (uint8
  // [H, W, 3], already resized as step 1 does) through the edit template.
  absl::StatusOr<PromptEmbeddings> EncodePrompts(
      const std::vector<std::string>& instructions,
      const std::vector<std::vector<at::Tensor>>& images);

  // Edit returns one uint8 [height, width, 3] image per input, in order.
  absl::StatusOr<std::vector<at::Tensor>> Edit(const std::vector<EditInput>& inputs,
                                               const EditOptions& options,
                                               const StepCallback& on_step = nullptr);

  // Prepare resizes and encodes the images and instructions of `rows` (one
  // group of SameSizeGroups; rows asking the same of the same images are
  // encoded once, and not at all when `cache` holds them) and draws their
  // noise; without gradients.
  absl::StatusOr<PreparedEdit> Prepare(const std::vector<const EditInput*>& rows,
                                       const EditOptions& options, ConditionCache* cache = nullptr);

  // Velocity: the transformer's prediction for `latents` at schedule
  // timestep `timestep` ([B], 0..1000), with true CFG when the prepared
  // edit has a negative prompt. Differentiable when grad mode is on.
  // `denoiser` replaces the model's own transformer (a frozen reference
  // copy, or a parity check's stand-in).
  absl::StatusOr<at::Tensor> Velocity(const PreparedEdit& prepared, const at::Tensor& latents,
                                      const at::Tensor& timestep, double true_cfg_scale,
                                      const Denoiser& denoiser = nullptr);

  // Scheduler: the shifted schedule of `steps` steps for `image_seq_len`
  // latent tokens, as the edit loop runs it.
  absl::StatusOr<FlowMatchEulerScheduler> Scheduler(int64_t image_seq_len, int steps) const;

  // EncodeImages turns uint8 [H, W, 3] images of one size into packed,
  // normalized latents [B, S, C] (the VAE's mean): what Decode turns back
  // into them. Without gradients.
  absl::StatusOr<at::Tensor> EncodeImages(const std::vector<at::Tensor>& images);

  // Decode turns packed latents into uint8 [height, width, 3] images.
  absl::StatusOr<std::vector<at::Tensor>> Decode(const at::Tensor& latents, int64_t height,
                                                 int64_t width);

  // last_edit_passes: for each input of the last Edit, its denoising
  // loop's passes (with a step cache; zeros without).
  const std::vector<EditPasses>& last_edit_passes() const { return last_edit_passes_; }

  // set_cfg_group spreads each guided step's two transformer passes over
  // `group`'s two ranks (null: one rank runs both), as xDiT's and
  // vLLM-Omni's CFG parallelism do: rank 0 predicts for the prompt, rank 1
  // for the negative prompt, both gather the two and combine them as one
  // rank would, so both hold the same latents, bit for bit those of one
  // rank. Both ranks must run the same rows; without guidance each
  // predicts for the prompt alone. Velocity with a `denoiser` of its own
  // (RL's reference) runs both passes here. `group` must outlive the pipeline's use.
  void set_cfg_group(Communicator* group) { cfg_group_ = group; }

  QwenImageModel& model() { return model_; }
  // vae_scale_factor: pixels per latent along each side.
  int64_t vae_scale_factor() const;

 private:
  // EncodeConditions fills cache entries `entries` (their instructions and
  // images): the prompt states (and the negative prompt's) of the images
  // resized for the text encoder, the VAE latents of those resized for it.
  absl::Status EncodeConditions(ConditionCache& cache, const std::vector<size_t>& entries,
                                const EditSizes& sizes,
                                const std::optional<std::string>& negative_prompt);
  // Denoise runs the flow-matching loop from the prepared noise, counting
  // its passes into `passes`.
  absl::StatusOr<at::Tensor> Denoise(const PreparedEdit& prepared, const EditOptions& options,
                                     const StepCallback& on_step, EditPasses& passes);

  QwenImageModel model_;
  Communicator* cfg_group_ = nullptr;
  // During Denoise with a step cache: the prompt's and the negative
  // prompt's (Velocity hands the transformer the one of its pass).
  std::array<StepCache, 2>* step_caches_ = nullptr;
  std::vector<EditPasses> last_edit_passes_;
};

}  // namespace dray::qwen_image

#endif  // DRAY_WORKERS_MODELS_QWEN_IMAGE_EDIT_PIPELINE_H_
