// The columns of an image-edit batch, as the controller sends them to
// QwenImageEditWorker and the worker returns them, and the checks every row
// passes before any model sees it:
//
//   in   preliminary_edited_images  images (PNG, JPEG, or raw RGB): picture 1
//        preliminary_edited_images_2, _3
//                                   optional, Edit-Plus models: pictures 2 and 3
//                                   (a row with fewer holds an empty image)
//        re_edit_instructions       strings, not empty
//        seeds                      ints, optional: each row's noise seed
//   out  final_edited_images        PNG images, in the input's row order
//
// Meta info may override the worker's configuration for one call:
// num_inference_steps, true_cfg_scale, negative_prompt ("" turns guidance
// off), guidance_scale (FLUX.1 Kontext), width and height (0 follows the
// input's aspect ratio).
//
//   DRAY_ASSIGN_OR_RETURN(DataProto batch, MakeEditBatch(images, instructions, seeds));
//   DRAY_RETURN_IF_ERROR(CheckEditBatch(batch, config, kind, tokens));  // headers only
//   DRAY_ASSIGN_OR_RETURN(std::vector<EditRow> rows, DecodeEditRows(batch, seed));  // a worker
#ifndef DRAY_WORKERS_PIPELINE_EDIT_BATCH_H_
#define DRAY_WORKERS_PIPELINE_EDIT_BATCH_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dispatch/data_proto.h"
#include "workers/models/bpe_tokenizer.h"
#include "workers/models/flux/kontext_helpers.h"
#include "workers/models/qwen_image/edit_pipeline.h"
#include "workers/models/t5/tokenizer.h"
#include "workers/pipeline/edit_config.h"

namespace dray {

inline constexpr char kImagesColumn[] = "preliminary_edited_images";
inline constexpr char kInstructionsColumn[] = "re_edit_instructions";
inline constexpr char kSeedsColumn[] = "seeds";
inline constexpr char kEditedColumn[] = "final_edited_images";
// Beside it, each row's denoising loop's transformer passes and those that
// reused the later blocks (with a step cache; zeros without).
inline constexpr char kTransformerPassesColumn[] = "transformer_passes";
inline constexpr char kReusedPassesColumn[] = "reused_passes";

// kMaxPictures: the most input images a row carries (Edit-Plus's).
inline constexpr int kMaxPictures = qwen_image::kMaxEditPlusImages;

// PictureColumn: the column of picture `picture` (1-based): kImagesColumn,
// then "preliminary_edited_images_2", ...
std::string PictureColumn(int picture);

// Limits on one row: larger inputs are INVALID_ARGUMENT, never a crash.
inline constexpr int64_t kMaxInputPixels = int64_t{4096} * 4096;
inline constexpr int64_t kMaxInstructionBytes = 4096;

// EditRow: one decoded, checked row.
struct EditRow {
  std::vector<at::Tensor> images;  // its pictures, RGB uint8 [H, W, 3]
  std::string instruction;
  uint64_t seed = 0;
};

// EncodedImageRow: a PNG or JPEG file's bytes as an image row (the format
// told apart by its signature; the row shares the buffer).
Image EncodedImageRow(const Bytes& bytes);

// MakeEditBatch builds a batch from encoded images (PNG or JPEG, told apart
// by their signature; the rows share the buffers): one per row, or each
// row's pictures (1 to kMaxPictures); instructions and, when not empty,
// per-row seeds.
absl::StatusOr<DataProto> MakeEditBatch(const std::vector<Bytes>& images,
                                        const std::vector<std::string>& instructions,
                                        const std::vector<int64_t>& seeds = {});
absl::StatusOr<DataProto> MakeEditBatch(const std::vector<std::vector<Bytes>>& pictures,
                                        const std::vector<std::string>& instructions,
                                        const std::vector<int64_t>& seeds = {});

// DecodeImageRow turns one image row (PNG, JPEG or raw) into RGB uint8
// [H, W, 3], bounded by kMaxInputPixels; a raw row whose bytes do not fit
// its size is INVALID_ARGUMENT.
absl::StatusOr<at::Tensor> DecodeImageRow(const Image& image);

// DecodeEditRows decodes and checks every row ("row 3: ..." counts rows of
// `batch`). Without a seeds column, row i's seed is `default_seed` + i.
absl::StatusOr<std::vector<EditRow>> DecodeEditRows(const DataProto& batch, int64_t default_seed);

// PromptTokenCounter: how many tokens the model's tokenizer makes of a
// prompt's text (BpeTokenizer::EncodeText).
using PromptTokenCounter = std::function<int64_t(absl::string_view text)>;

// CountTokensWith counts with `tokenizer` (Qwen-Image's; FLUX.1 Kontext's
// T5, whose unpadded tokens count).
PromptTokenCounter CountTokensWith(std::shared_ptr<const BpeTokenizer> tokenizer);
PromptTokenCounter CountTokensWith(std::shared_ptr<const t5::Tokenizer> tokenizer);

// PromptTokenCounterFor counts with the prompt tokenizer of the model
// directory `model_dir`: Qwen-Image's, or FLUX.1 Kontext's T5 (CLIP sees
// at most 77 tokens, as in diffusers).
absl::StatusOr<PromptTokenCounter> PromptTokenCounterFor(const std::string& model_dir);

// CheckEditBatch is admission: it makes DecodeEditRows' checks from the
// image headers alone (no pixel is decoded; PNG and JPEG bodies are first
// read by the worker), holds each row's pictures to what a pipeline of
// `kind` takes (CheckPictureCount), and to `config`'s budget: the meta
// options (EditOptionsFor), an output of at most max_pixels, and an
// instruction and negative prompt of at most max_prompt_tokens (counted by
// `count_tokens`; null counts none). INVALID_ARGUMENT names the row and the
// limit; rows count from `first_row`.
absl::Status CheckEditBatch(const DataProto& batch, const ImageEditConfig& config,
                            qwen_image::EditPipelineKind kind,
                            const PromptTokenCounter& count_tokens, int64_t first_row = 0);

// WithSeeds returns `batch` with a seeds column: its own, or `first_seed` +
// each row's index. The controller adds them before dispatch, so a row's
// noise depends on neither how the batch is split nor where the row lands.
absl::StatusOr<DataProto> WithSeeds(const DataProto& batch, int64_t first_seed);

// EditPipelineKindOf: the pipeline of `config`'s model directory (the
// embedded model's preset, with no model_path).
absl::StatusOr<qwen_image::EditPipelineKind> EditPipelineKindOf(const ImageEditConfig& config);

// EditOptionsFor returns the pipeline options of `config`, overridden by
// the batch's meta info (keys above; a wrong type is INVALID_ARGUMENT).
absl::StatusOr<qwen_image::EditOptions> EditOptionsFor(const ImageEditConfig& config,
                                                       const MetaInfo& meta);

// KontextOptionsOf: FLUX.1 Kontext's options for what `edit` asks (steps,
// true CFG, output about edit.image_size^2 pixels at its or else the
// input's aspect ratio, input_width x input_height), with the embedded
// `guidance_scale` and T5's `max_sequence_length`.
flux::KontextOptions KontextOptionsOf(const qwen_image::EditOptions& edit, double guidance_scale,
                                      int64_t max_sequence_length, int64_t input_width,
                                      int64_t input_height);

// KontextOptionsFor: the same for FLUX.1 Kontext (guidance_scale from the
// meta info or `config`; the output at about image_size^2 pixels, at the
// requested or the input's aspect ratio, `input_width` x `input_height`;
// max_prompt_tokens T5 tokens).
absl::StatusOr<flux::KontextOptions> KontextOptionsFor(const ImageEditConfig& config,
                                                       const MetaInfo& meta, int64_t input_width,
                                                       int64_t input_height);

}  // namespace dray

#endif  // DRAY_WORKERS_PIPELINE_EDIT_BATCH_H_
