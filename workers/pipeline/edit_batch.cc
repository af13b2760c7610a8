#include "workers/pipeline/edit_batch.h"

#include <ATen/ops/from_blob.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "workers/image/image_codec.h"
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
  const std::vector<Image>* images = nullptr;
  const std::vector<std::string>* instructions = nullptr;
  const std::vector<int64_t>* seeds = nullptr;  // null: no seeds column
};

absl::StatusOr<EditColumns> ColumnsOf(const DataProto& batch) {
  EditColumns columns;
  DRAY_ASSIGN_OR_RETURN(columns.images, batch.GetRows<Image>(kImagesColumn));
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

absl::StatusOr<DataProto> MakeEditBatch(const std::vector<Bytes>& images,
                                        const std::vector<std::string>& instructions,
                                        const std::vector<int64_t>& seeds) {
  std::vector<Image> rows;
  for (const Bytes& bytes : images) rows.push_back(EncodedImageRow(bytes));
  NonTensorColumns columns = {{kImagesColumn, std::move(rows)},
                              {kInstructionsColumn, instructions}};
  if (!seeds.empty()) columns.emplace_back(kSeedsColumn, seeds);
  return DataProto::Make({}, std::move(columns));
}

absl::StatusOr<std::vector<EditRow>> DecodeEditRows(const DataProto& batch, int64_t default_seed) {
  DRAY_ASSIGN_OR_RETURN(EditColumns columns, ColumnsOf(batch));
  std::vector<EditRow> rows;
  for (int64_t row = 0; row < batch.size(); ++row) {
    absl::StatusOr<uint64_t> seed = SeedOf(columns, row, default_seed);
    if (!seed.ok()) return BadRow(row, seed.status().message());
    absl::StatusOr<at::Tensor> image = DecodeImageRow((*columns.images)[row]);
    if (!image.ok()) return BadRow(row, image.status().message());
    rows.push_back({*std::move(image), (*columns.instructions)[row], *seed});
  }
  return rows;
}

PromptTokenCounter CountTokensWith(std::shared_ptr<const BpeTokenizer> tokenizer) {
  return [tokenizer = std::move(tokenizer)](absl::string_view text) {
    return static_cast<int64_t>(tokenizer->EncodeText(text).size());
  };
}

absl::Status CheckEditBatch(const DataProto& batch, const ImageEditConfig& config,
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
    if (checked.ok()) {
      absl::StatusOr<std::pair<int64_t, int64_t>> size = ProbeRow((*columns.images)[row]);
      checked = size.ok() ? CheckOutputSize(*size, *options, config.max_pixels) : size.status();
    }
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

absl::StatusOr<qwen_image::EditOptions> EditOptionsFor(const ImageEditConfig& config,
                                                       const MetaInfo& meta) {
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

}  // namespace dray
