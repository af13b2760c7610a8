#include "workers/edit/edit_batch.h"

#include <ATen/ops/from_blob.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "workers/image/image_codec.h"

namespace dray {
namespace {

absl::Status BadRow(int64_t row, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("row ", row, ": ", why));
}

// DecodeRow turns one image row into RGB, bounded by kMaxInputPixels.
absl::StatusOr<at::Tensor> DecodeRow(const Image& image) {
  if (image.format != Image::Format::kRaw) return DecodeImage(image.bytes.view(), kMaxInputPixels);
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
  return at::from_blob(const_cast<char*>(image.bytes.data()), {image.height, image.width, 3},
                       at::kByte)
      .clone();
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

absl::StatusOr<DataProto> MakeEditBatch(const std::vector<Bytes>& images,
                                        const std::vector<std::string>& instructions,
                                        const std::vector<int64_t>& seeds) {
  std::vector<Image> rows;
  for (const Bytes& bytes : images) {
    rows.push_back(
        {IsJpeg(bytes.view()) ? Image::Format::kJpeg : Image::Format::kPng, 0, 0, 0, bytes});
  }
  NonTensorColumns columns = {{kImagesColumn, std::move(rows)},
                              {kInstructionsColumn, instructions}};
  if (!seeds.empty()) columns.emplace_back(kSeedsColumn, seeds);
  return DataProto::Make({}, std::move(columns));
}

absl::StatusOr<std::vector<EditRow>> DecodeEditRows(const DataProto& batch, int64_t first_row,
                                                    int64_t default_seed) {
  DRAY_ASSIGN_OR_RETURN(const std::vector<Image>* images, batch.GetRows<Image>(kImagesColumn));
  DRAY_ASSIGN_OR_RETURN(const std::vector<std::string>* instructions,
                        batch.GetRows<std::string>(kInstructionsColumn));
  const std::vector<int64_t>* seeds = nullptr;
  if (batch.HasColumn(kSeedsColumn)) {
    DRAY_ASSIGN_OR_RETURN(seeds, batch.GetRows<int64_t>(kSeedsColumn));
  }
  std::vector<EditRow> rows;
  for (int64_t i = 0; i < batch.size(); ++i) {
    const int64_t row = first_row + i;
    const std::string& instruction = (*instructions)[i];
    if (instruction.find_first_not_of(" \t\r\n") == std::string::npos)
      return BadRow(row, "the instruction is empty");
    if (static_cast<int64_t>(instruction.size()) > kMaxInstructionBytes) {
      return BadRow(row, absl::StrCat("the instruction has ", instruction.size(),
                                      " bytes; at most ", kMaxInstructionBytes, " are accepted"));
    }
    const int64_t seed = seeds != nullptr ? (*seeds)[i] : default_seed + row;
    if (seed < 0) return BadRow(row, absl::StrCat("seed ", seed, " is negative"));
    absl::StatusOr<at::Tensor> image = DecodeRow((*images)[i]);
    if (!image.ok()) return BadRow(row, image.status().message());
    rows.push_back({*std::move(image), instruction, static_cast<uint64_t>(seed)});
  }
  return rows;
}

absl::Status CheckEditBatch(const DataProto& batch) { return DecodeEditRows(batch, 0, 0).status(); }

absl::StatusOr<qwen_image::EditOptions> EditOptionsFor(const ImageEditConfig& config,
                                                       const MetaInfo& meta) {
  qwen_image::EditOptions options;
  options.image_size = config.image_size;
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
