// QwenImageEditPipeline: an image and an instruction in, the edited image
// out, as diffusers' QwenImageEditPipeline computes it:
//
//   1. resize the input to about image_size^2 pixels (CalculateDimensions,
//      Lanczos), keeping its aspect ratio;
//   2. encode the instruction with Qwen2.5-VL, which also sees the image
//      (the edit chat template; the system turn's states dropped); the
//      negative prompt likewise when classifier-free guidance is on;
//   3. VAE-encode the resized image (mode, normalized, 2x2-packed);
//   4. from seeded Gaussian noise, denoise with the transformer over
//      [noisy tokens, image tokens], with true CFG (rescaled to the
//      conditional prediction's norm) when true_cfg_scale > 1 and a
//      negative prompt is given, stepping the shifted flow-matching schedule;
//   5. unpack, de-normalize and VAE-decode to an 8-bit RGB image.
//
//   DRAY_ASSIGN_OR_RETURN(QwenImageModel model, LoadQwenImageModel(dir, at::kFloat));
//   QwenImageEditPipeline pipeline(std::move(model));
//   DRAY_ASSIGN_OR_RETURN(auto images, pipeline.Edit({{rgb, "make the sky green", /*seed=*/7}},
//   options));
//
// Each row's noise comes from its own seed, so a row's result does not
// depend on which rows share its batch. Rows with images of one size are
// denoised together as one batch.
//
// Thread-safety: not thread-safe (the models are not).
#ifndef DRAY_WORKERS_MODELS_QWEN_IMAGE_EDIT_PIPELINE_H_
#define DRAY_WORKERS_MODELS_QWEN_IMAGE_EDIT_PIPELINE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "workers/models/qwen_image/model.h"
#include "workers/models/qwen_image/scheduler.h"

namespace dray::qwen_image {

struct EditInput {
  at::Tensor image;  // RGB, uint8 [H, W, 3]
  std::string instruction;
  uint64_t seed = 0;  // this row's noise
};

struct EditOptions {
  int num_inference_steps = 50;
  double true_cfg_scale = 4.0;
  // Guidance runs only with a negative prompt and true_cfg_scale > 1
  // (diffusers: " " is a common negative prompt).
  std::optional<std::string> negative_prompt;
  // The input is resized to about image_size^2 pixels (diffusers: 1024).
  int64_t image_size = 1024;
  // Output size; each defaults to the resized input's, and is floored to a
  // multiple of 2 x the VAE's scale factor.
  std::optional<int64_t> width, height;
};

// StepCallback: called after each denoising step, with the steps done and
// the steps of the whole call (every loop's; see DenoisingLoops). An error
// it returns ends the edit with that error (a caller's cancellation).
using StepCallback = std::function<absl::Status(int step, int steps)>;

// DenoisingLoops: how many denoising loops an Edit of `inputs` runs: one per
// distinct input image size, each of num_inference_steps steps.
int64_t DenoisingLoops(const std::vector<EditInput>& inputs);

// ToPixels maps uint8 [H, W, 3] images of one size to the VAE's input
// [B, 3, 1, H, W] in [-1, 1]; ToImages maps its output [B, 3, H, W] back.
at::Tensor ToPixels(const std::vector<at::Tensor>& images, const at::TensorOptions& options);
std::vector<at::Tensor> ToImages(const at::Tensor& decoded);

// EncodeEditPrompt tokenizes the edit template around `instruction`. The
// template's control tokens are matched; the instruction is plain text (a
// "<|im_end|>" a user types is those ten characters, not the end of the
// turn). For an instruction without control tokens the ids equal what
// transformers' tokenizer gives for the whole templated string.
std::vector<int64_t> EncodeEditPrompt(const BpeTokenizer& tokenizer, absl::string_view instruction);

// PromptEmbeddings: the transformer's text input for a batch.
struct PromptEmbeddings {
  at::Tensor embeds;  // [B, L, hidden], zero past each prompt's end
  at::Tensor mask;    // int64 [B, L]: 1 for real tokens
};

// PreparedEdit: rows sharing an image size, ready to denoise: what the
// edit loop and an RL rollout (or its training step) start from.
struct PreparedEdit {
  at::Tensor noise;          // packed initial latents [B, S, C], each row's from its seed
  at::Tensor image_latents;  // packed, normalized VAE latents of the resized inputs
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
// cache's (image size, guidance) clear it.
class ConditionCache {
 public:
  void Clear() { entries_.clear(); }
  size_t size() const { return entries_.size(); }

 private:
  friend class QwenImageEditPipeline;
  struct Entry {
    std::string instruction;
    at::Tensor image;     // the row's input, to match on
    at::Tensor embeds;    // [tokens, hidden]: no padding
    at::Tensor negative;  // the same for the negative prompt, when guidance runs
    at::Tensor latents;   // [S, C], packed
  };
  std::string options_;  // what the entries were encoded under
  std::vector<Entry> entries_;
};

// SameSizeGroups returns the indices of `inputs` grouped by image size (each
// group one denoising loop), after checking every image and `options`.
absl::StatusOr<std::vector<std::vector<size_t>>> SameSizeGroups(
    const std::vector<EditInput>& inputs, const EditOptions& options);

class QwenImageEditPipeline {
 public:
  explicit QwenImageEditPipeline(QwenImageModel model);

  // EncodePrompts encodes each instruction with its image (uint8 [H, W, 3],
  // already resized as step 1 does) through the edit template.
  absl::StatusOr<PromptEmbeddings> EncodePrompts(const std::vector<std::string>& instructions,
                                                 const std::vector<at::Tensor>& images);

  // Edit returns one uint8 [height, width, 3] image per input, in order.
  absl::StatusOr<std::vector<at::Tensor>> Edit(const std::vector<EditInput>& inputs,
                                               const EditOptions& options,
                                               const StepCallback& on_step = nullptr);

  // Prepare resizes and encodes the images and instructions of `rows` (one
  // image size; rows asking the same of the same image are encoded once,
  // and not at all when `cache` holds them) and draws their noise; without
  // gradients.
  absl::StatusOr<PreparedEdit> Prepare(const std::vector<const EditInput*>& rows,
                                       const EditOptions& options, ConditionCache* cache = nullptr);

  // Velocity: the transformer's prediction for `latents` at schedule
  // timestep `timestep` ([B], 0..1000), with true CFG when the prepared
  // edit has a negative prompt. Differentiable when grad mode is on.
  // `transformer` replaces the model's own (a frozen reference copy).
  absl::StatusOr<at::Tensor> Velocity(const PreparedEdit& prepared, const at::Tensor& latents,
                                      const at::Tensor& timestep, double true_cfg_scale,
                                      QwenImageTransformerImpl* transformer = nullptr);

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

  QwenImageModel& model() { return model_; }
  // vae_scale_factor: pixels per latent along each side.
  int64_t vae_scale_factor() const;

 private:
  // EncodeConditions fills cache entries `entries` (their instructions and
  // images): the images resized to height x width, the prompt states (and
  // the negative prompt's), the VAE latents.
  absl::Status EncodeConditions(ConditionCache& cache, const std::vector<size_t>& entries,
                                int64_t height, int64_t width,
                                const std::optional<std::string>& negative_prompt);
  // Denoise runs the flow-matching loop from the prepared noise.
  absl::StatusOr<at::Tensor> Denoise(const PreparedEdit& prepared, const EditOptions& options,
                                     const StepCallback& on_step);

  QwenImageModel model_;
  int64_t dropped_tokens_;  // template tokens whose hidden states are dropped
};

}  // namespace dray::qwen_image

#endif  // DRAY_WORKERS_MODELS_QWEN_IMAGE_EDIT_PIPELINE_H_
