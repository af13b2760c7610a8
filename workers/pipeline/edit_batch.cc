#include "workers/pipeline/edit_batch.h"

#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "workers/image/image_codec.h"
#include "workers/models/model_index.h"
#include "workers/models/qwen_image/model.h"
#include "workers/models/qwen_image/pipeline_helpers.h"

namespace dray {
namespace {

absl::Status BadRow(int64_t row, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("row ", row, ": ", why));
}

// CheckRawRow checks a raw image row's layout and size.
absl::Status CheckRawRow(const Image& image) {
  if (image.channels != 3 || image.width < 1 || image.height < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a raw image must be RGB with a positive size, got ", image.width, "x",
                     image.height, "x", image.channels));
  }
  if (int64_t{image.width} * image.height > kMaxInputPixels) {
    return absl::InvalidArgumentError(absl::StrCat("image is ", image.width, "x", image.height,
                                                   "; at most ", kMaxInputPixels,
                                                   " pixels are accepted"));
  }
  if (static_cast<int64_t>(image.bytes.size()) != int64_t{image.width} * image.height * 3) {
    return absl::InvalidArgumentError(absl::StrCat("raw image of ", image.width, "x", image.height,
                                                   " has ", image.bytes.size(), " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<at::Tensor> DecodeImageRow(const Image& image) {
  if (image.format != Image::Format::kRaw) return DecodeImage(image.bytes.view(), kMaxInputPixels);
  DRAY_RETURN_IF_ERROR(CheckRawRow(image));
  return at::from_blob(const_cast<char*>(image.bytes.data()), {image.height, image.width, 3},
                       at::kByte)
      .clone();
}

namespace {

// ProbeRow checks what DecodeImageRow would, from the header alone, and returns
// the image's {width, height}.
absl::StatusOr<std::pair<int64_t, int64_t>> ProbeRow(const Image& image) {
  if (image.format == Image::Format::kRaw) {
    DRAY_RETURN_IF_ERROR(CheckRawRow(image));
    return std::pair<int64_t, int64_t>{image.width, image.height};
  }
  DRAY_ASSIGN_OR_RETURN(ImageHeader header, ProbeImage(image.bytes.view(), kMaxInputPixels));
  return std::pair{header.width, header.height};
}

// CheckOutputSize holds the output an image of `size` asks for to max_pixels.
absl::Status CheckOutputSize(std::pair<int64_t, int64_t> size,
                             const qwen_image::EditOptions& options, int64_t max_pixels) {
  const auto [width, height] = qwen_image::EditOutputSize(
      size.first, size.second, options.width, options.height,
      /*vae_scale_factor=*/1, double(options.image_size) * options.image_size);
  if (width * height <= max_pixels) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("the output would be ", width, "x", height, " = ",
                                                 width * height, " pixels; ", kConfigSection,
                                                 ".max_pixels allows ", max_pixels));
}

// CheckPromptTokens holds `text` to max_prompt_tokens.
absl::Status CheckPromptTokens(absl::string_view what, absl::string_view text,
                               const PromptTokenCounter& count_tokens, int64_t max_tokens) {
  if (count_tokens == nullptr) return absl::OkStatus();
  const int64_t tokens = count_tokens(text);
  if (tokens <= max_tokens) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("the ", what, " has ", tokens, " tokens; ",
                                                 kConfigSection, ".max_prompt_tokens allows ",
                                                 max_tokens));
}

// EditColumns: a batch's columns, checked for presence and type.
struct EditColumns {
  std::vector<const std::vector<Image>*> pictures;  // picture 1's, then those present
  const std::vector<std::string>* instructions = nullptr;
  const std::vector<int64_t>* seeds = nullptr;  // null: no seeds column
};

absl::StatusOr<EditColumns> ColumnsOf(const DataProto& batch) {
  EditColumns columns;
  for (int picture = 1; picture <= kMaxPictures; ++picture) {
    const std::string column = PictureColumn(picture);
    if (picture > 1 && !batch.HasColumn(column)) break;
    DRAY_ASSIGN_OR_RETURN(const std::vector<Image>* images, batch.GetRows<Image>(column));
    columns.pictures.push_back(images);
  }
  DRAY_ASSIGN_OR_RETURN(columns.instructions, batch.GetRows<std::string>(kInstructionsColumn));
  if (batch.HasColumn(kSeedsColumn)) {
    DRAY_ASSIGN_OR_RETURN(columns.seeds, batch.GetRows<int64_t>(kSeedsColumn));
  }
  return columns;
}

// SeedOf returns row `row`'s seed after checking its instruction: what a row
// needs besides its pixels.
absl::StatusOr<uint64_t> SeedOf(const EditColumns& columns, int64_t row, int64_t default_seed) {
  const std::string& instruction = (*columns.instructions)[row];
  if (instruction.find_first_not_of(" \t\r\n") == std::string::npos)
    return absl::InvalidArgumentError("the instruction is empty");
  if (static_cast<int64_t>(instruction.size()) > kMaxInstructionBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the instruction has ", instruction.size(),
                                                   " bytes; at most ", kMaxInstructionBytes,
                                                   " are accepted"));
  }
  const int64_t seed = columns.seeds != nullptr ? (*columns.seeds)[row] : default_seed + row;
  if (seed < 0) return absl::InvalidArgumentError(absl::StrCat("seed ", seed, " is negative"));
  return static_cast<uint64_t>(seed);
}

// PicturesOf: row `row`'s pictures, in order; an empty image ends them,
// and no picture may follow it.
absl::StatusOr<std::vector<const Image*>> PicturesOf(const EditColumns& columns, int64_t row) {
  std::vector<const Image*> pictures;
  for (size_t p = 0; p < columns.pictures.size(); ++p) {
    const Image& image = (*columns.pictures[p])[row];
    if (image.bytes.empty()) continue;
    if (pictures.size() != p) {
      return absl::InvalidArgumentError(
          absl::StrCat("picture ", p + 1, " is given without picture ", pictures.size() + 1));
    }
    pictures.push_back(&image);
  }
  if (pictures.empty()) return absl::InvalidArgumentError("the row has no input image");
  return pictures;
}

// PictureError: a picture's error, naming it when the row has several.
std::string PictureError(size_t picture, size_t pictures, const absl::Status& error) {
  if (pictures == 1) return std::string(error.message());
  return absl::StrCat("picture ", picture + 1, ": ", error.message());
}

// CheckPictures probes a row's pictures, holds their number to what `kind`
// takes and the output, sized after the last one, to max_pixels.
absl::Status CheckPictures(const EditColumns& columns, int64_t row,
                           const qwen_image::EditOptions& options, int64_t max_pixels,
                           qwen_image::EditPipelineKind kind) {
  DRAY_ASSIGN_OR_RETURN(std::vector<const Image*> pictures, PicturesOf(columns, row));
  DRAY_RETURN_IF_ERROR(
      qwen_image::CheckPictureCount(pictures.size(), (*columns.instructions)[row], kind));
  std::pair<int64_t, int64_t> size;
  for (size_t p = 0; p < pictures.size(); ++p) {
    absl::StatusOr<std::pair<int64_t, int64_t>> probed = ProbeRow(*pictures[p]);
    if (!probed.ok())
      return absl::InvalidArgumentError(PictureError(p, pictures.size(), probed.status()));
    size = *probed;
  }
  return CheckOutputSize(size, options, max_pixels);
}

template <typename T>
absl::StatusOr<T> MetaOr(const MetaInfo& meta, const char* key, T fallback) {
  auto it = meta.find(key);
  if (it == meta.end()) return fallback;
  if (const T* value = std::get_if<T>(&it->second)) return *value;
  return absl::InvalidArgumentError(absl::StrCat("meta key ", key, " must be ",
                                                 MetaValueKind(MetaValue(T{})), ", got ",
                                                 MetaValueKind(it->second)));
}

}  // namespace

Image EncodedImageRow(const Bytes& bytes) {
  return {IsJpeg(bytes.view()) ? Image::Format::kJpeg : Image::Format::kPng, 0, 0, 0, bytes};
}

std::string PictureColumn(int picture) {
  return picture == 1 ? kImagesColumn : absl::StrCat(kImagesColumn, "_", picture);
}

absl::StatusOr<DataProto> MakeEditBatch(const std::vector<Bytes>& images,
                                        const std::vector<std::string>& instructions,
                                        const std::vector<int64_t>& seeds) {
  std::vector<std::vector<Bytes>> pictures;
  for (const Bytes& bytes : images) pictures.push_back({bytes});
  return MakeEditBatch(pictures, instructions, seeds);
}

absl::StatusOr<DataProto> MakeEditBatch(const std::vector<std::vector<Bytes>>& pictures,
                                        const std::vector<std::string>& instructions,
                                        const std::vector<int64_t>& seeds) {
  size_t most = 1;
  for (const std::vector<Bytes>& row : pictures) most = std::max(most, row.size());
  if (most > kMaxPictures) {
    return absl::InvalidArgumentError(
        absl::StrCat("a row has ", most, " input images; at most ", kMaxPictures));
  }
  NonTensorColumns columns;
  for (size_t p = 0; p < most; ++p) {
    std::vector<Image> images;
    for (const std::vector<Bytes>& row : pictures)
      images.push_back(p < row.size() ? EncodedImageRow(row[p]) : Image{});
    columns.emplace_back(PictureColumn(static_cast<int>(p) + 1), std::move(images));
  }
  columns.emplace_back(kInstructionsColumn, instructions);
  if (!seeds.empty()) columns.emplace_back(kSeedsColumn, seeds);
  return DataProto::Make({}, std::move(columns));
}

absl::StatusOr<std::vector<EditRow>> DecodeEditRows(const DataProto& batch, int64_t default_seed) {
  DRAY_ASSIGN_OR_RETURN(EditColumns columns, ColumnsOf(batch));
  std::vector<EditRow> rows;
  for (int64_t row = 0; row < batch.size(); ++row) {
    absl::StatusOr<uint64_t> seed = SeedOf(columns, row, default_seed);
    if (!seed.ok()) return BadRow(row, seed.status().message());
    absl::StatusOr<std::vector<const Image*>> pictures = PicturesOf(columns, row);
    if (!pictures.ok()) return BadRow(row, pictures.status().message());
    EditRow& decoded = rows.emplace_back();
    for (size_t p = 0; p < pictures->size(); ++p) {
      absl::StatusOr<at::Tensor> image = DecodeImageRow(*(*pictures)[p]);
      if (!image.ok()) return BadRow(row, PictureError(p, pictures->size(), image.status()));
      decoded.images.push_back(*std::move(image));
    }
    decoded.instruction = (*columns.instructions)[row];
    decoded.seed = *seed;
  }
  return rows;
}

PromptTokenCounter CountTokensWith(std::shared_ptr<const BpeTokenizer> tokenizer) {
  return [tokenizer = std::move(tokenizer)](absl::string_view text) {
    return static_cast<int64_t>(tokenizer->EncodeText(text).size());
  };
}

PromptTokenCounter CountTokensWith(std::shared_ptr<const t5::Tokenizer> tokenizer) {
  return [tokenizer = std::move(tokenizer)](absl::string_view text) {
    return static_cast<int64_t>(tokenizer->EncodeUnpadded(text).size());
  };
}

absl::Status CheckEditBatch(const DataProto& batch, const ImageEditConfig& config,
                            qwen_image::EditPipelineKind kind,
                            const PromptTokenCounter& count_tokens, int64_t first_row) {
  DRAY_ASSIGN_OR_RETURN(EditColumns columns, ColumnsOf(batch));
  absl::StatusOr<qwen_image::EditOptions> options = EditOptionsFor(config, batch.meta_info());
  absl::Status checked = options.status();
  if (checked.ok() && options->negative_prompt.has_value()) {
    checked = CheckPromptTokens("negative prompt", *options->negative_prompt, count_tokens,
                                config.max_prompt_tokens);
  }
  if (!checked.ok()) return BadRow(first_row, checked.message());
  for (int64_t row = 0; row < batch.size(); ++row) {
    checked = SeedOf(columns, row, 0).status();
    if (checked.ok()) {
      checked = CheckPromptTokens("instruction", (*columns.instructions)[row], count_tokens,
                                  config.max_prompt_tokens);
    }
    if (checked.ok()) checked = CheckPictures(columns, row, *options, config.max_pixels, kind);
    if (!checked.ok()) return BadRow(first_row + row, checked.message());
  }
  return absl::OkStatus();
}

absl::StatusOr<DataProto> WithSeeds(const DataProto& batch, int64_t first_seed) {
  if (batch.HasColumn(kSeedsColumn)) return batch;
  std::vector<int64_t> seeds(batch.size());
  for (int64_t row = 0; row < batch.size(); ++row) seeds[row] = first_seed + row;
  DataProto seeded = batch;
  DRAY_RETURN_IF_ERROR(seeded.AddNonTensor(kSeedsColumn, std::move(seeds)));
  return seeded;
}

absl::StatusOr<qwen_image::EditPipelineKind> EditPipelineKindOf(const ImageEditConfig& config) {
  if (config.model_path.empty()) return qwen_image::PresetNamed("embedded").value().pipeline;
  DRAY_ASSIGN_OR_RETURN(ModelFamily family, ReadModelFamily(config.model_path));
  // FLUX.1 Kontext edits one picture, as Qwen-Image-Edit does.
  if (family == ModelFamily::kFluxKontext) return qwen_image::EditPipelineKind::kEdit;
  return qwen_image::ReadEditPipelineKind(config.model_path);
}

absl::StatusOr<PromptTokenCounter> PromptTokenCounterFor(const std::string& model_dir) {
  DRAY_ASSIGN_OR_RETURN(ModelFamily family, ReadModelFamily(model_dir));
  if (family == ModelFamily::kFluxKontext) {
    DRAY_ASSIGN_OR_RETURN(t5::Tokenizer tokenizer,
                          t5::Tokenizer::FromDirectory(model_dir + "/tokenizer_2"));
    return CountTokensWith(std::make_shared<const t5::Tokenizer>(std::move(tokenizer)));
  }
  DRAY_ASSIGN_OR_RETURN(BpeTokenizer tokenizer,
                        BpeTokenizer::FromDirectory(model_dir + "/tokenizer"));
  return CountTokensWith(std::make_shared<const BpeTokenizer>(std::move(tokenizer)));
}

namespace {

// GuidanceScaleFor: the embedded guidance of guidance-distilled models
// (FLUX.1 Kontext), from the meta info or `config`, in [0, 100] (NaN refused).
absl::StatusOr<double> GuidanceScaleFor(const ImageEditConfig& config, const MetaInfo& meta) {
  DRAY_ASSIGN_OR_RETURN(const double scale,
                        MetaOr<double>(meta, "guidance_scale", config.guidance_scale));
  if (scale >= 0 && scale <= 100) return scale;
  return absl::InvalidArgumentError(
      absl::StrCat("guidance_scale must lie in [0, 100], got ", scale));
}

}  // namespace

absl::StatusOr<qwen_image::EditOptions> EditOptionsFor(const ImageEditConfig& config,
                                                       const MetaInfo& meta) {
  // Checked for every family, so that admission refuses it for all alike.
  DRAY_RETURN_IF_ERROR(GuidanceScaleFor(config, meta).status());
  qwen_image::EditOptions options;
  options.image_size = config.image_size;
  options.condition_image_size = config.condition_image_size;
  DRAY_ASSIGN_OR_RETURN(int64_t steps,
                        MetaOr<int64_t>(meta, "num_inference_steps", config.num_inference_steps));
  DRAY_ASSIGN_OR_RETURN(options.true_cfg_scale,
                        MetaOr<double>(meta, "true_cfg_scale", config.true_cfg_scale));
  DRAY_ASSIGN_OR_RETURN(std::string negative,
                        MetaOr<std::string>(meta, "negative_prompt", config.negative_prompt));
  DRAY_ASSIGN_OR_RETURN(int64_t width, MetaOr<int64_t>(meta, "width", 0));
  DRAY_ASSIGN_OR_RETURN(int64_t height, MetaOr<int64_t>(meta, "height", 0));
  DRAY_ASSIGN_OR_RETURN(options.step_cache.threshold,
                        MetaOr<double>(meta, "step_cache_threshold", config.step_cache_threshold));
  options.step_cache.warmup_steps = static_cast<int>(config.step_cache_warmup_steps);
  if (!(options.step_cache.threshold >= 0 && options.step_cache.threshold <= 10)) {
    return absl::InvalidArgumentError(absl::StrCat("step_cache_threshold must lie in [0, 10], got ",
                                                   options.step_cache.threshold));
  }
  if (options.step_cache.threshold > 0 && config.enable_fsdp) {
    return absl::InvalidArgumentError(
        "step_cache_threshold must be 0 on workers with enable_fsdp (a cached step skips "
        "blocks, which sharded ranks gather together)");
  }
  if (steps < 1 || steps > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_inference_steps must lie in [1, 1000], got ", steps));
  }
  if (!(options.true_cfg_scale >= 0 && options.true_cfg_scale <= 100)) {
    return absl::InvalidArgumentError(
        absl::StrCat("true_cfg_scale must lie in [0, 100], got ", options.true_cfg_scale));
  }
  for (auto [name, value] : {std::pair<const char*, int64_t>{"width", width}, {"height", height}}) {
    if (value != 0 && (value < 16 || value > 4096)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " must be 0 (follow the input) or lie in [16, 4096], got ", value));
    }
  }
  options.num_inference_steps = static_cast<int>(steps);
  if (!negative.empty()) options.negative_prompt = negative;
  if (width != 0) options.width = width;
  if (height != 0) options.height = height;
  return options;
}

flux::KontextOptions KontextOptionsOf(const qwen_image::EditOptions& edit, double guidance_scale,
                                      int64_t max_sequence_length, int64_t input_width,
                                      int64_t input_height) {
  flux::KontextOptions options;
  options.num_inference_steps = edit.num_inference_steps;
  options.true_cfg_scale = edit.true_cfg_scale;
  options.negative_prompt = edit.negative_prompt;
  options.guidance_scale = guidance_scale;
  options.max_area = edit.image_size * edit.image_size;
  options.width = edit.width.value_or(input_width);
  options.height = edit.height.value_or(input_height);
  options.max_sequence_length = max_sequence_length;
  return options;
}

absl::StatusOr<flux::KontextOptions> KontextOptionsFor(const ImageEditConfig& config,
                                                       const MetaInfo& meta, int64_t input_width,
                                                       int64_t input_height) {
  DRAY_ASSIGN_OR_RETURN(qwen_image::EditOptions edit, EditOptionsFor(config, meta));
  DRAY_ASSIGN_OR_RETURN(double guidance_scale, GuidanceScaleFor(config, meta));
  return KontextOptionsOf(edit, guidance_scale, config.max_prompt_tokens, input_width,
                          input_height);
}

}  // namespace dray
