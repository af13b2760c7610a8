#include "workers/parity/qwen2_vl_parity.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/io/safetensors.h"
#include "workers/models/image_resize.h"
#include "workers/models/qwen2_vl/image_processor.h"
#include "workers/models/qwen2_vl/text_encoder.h"

namespace dray::qwen2_vl {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kModelTolerance = 1e-5;
constexpr double kPixelTolerance = 1e-6;

using Outputs = std::vector<ParityResult>;

absl::StatusOr<std::shared_ptr<const SafetensorsFile>> OpenCase(const ParityCase& c) {
  return SafetensorsFile::Open((fs::path(c.folder) / (c.name + ".safetensors")).string());
}

std::vector<ImageGrid> Grids(const at::Tensor& image_grid_thw) {
  const at::Tensor grids = image_grid_thw.to(at::kLong).contiguous();
  std::vector<ImageGrid> out;
  for (int64_t i = 0; i < grids.size(0); ++i)
    out.push_back(
        {grids[i][0].item<int64_t>(), grids[i][1].item<int64_t>(), grids[i][2].item<int64_t>()});
  return out;
}

// RopeDeltas: what get_rope_index returns beside the positions (the shift
// generation would continue from): max position + 1 - sequence length.
at::Tensor RopeDeltas(const at::Tensor& positions) {
  return std::get<0>(positions.amax(0).max(-1, /*keepdim=*/true)) + 1 - positions.size(-1);
}

// A text-only or multimodal batch through the whole encoder.
absl::StatusOr<Outputs> RunPrompts(const ParityCase& c, Qwen25VLTextEncoderImpl& encoder,
                                   const SafetensorsFile& file) {
  DRAY_ASSIGN_OR_RETURN(at::Tensor ids, file.Get("input_ids"));
  DRAY_ASSIGN_OR_RETURN(at::Tensor mask, file.Get("attention_mask"));
  std::vector<ImageGrid> grids;
  at::Tensor patches;
  if (file.contains("image_grid_thw")) {
    // The images' patches are the vision case's (the README's layout).
    grids = Grids(file.Get("image_grid_thw").value());
    DRAY_ASSIGN_OR_RETURN(
        auto vision,
        SafetensorsFile::Open((fs::path(c.folder) / "case_vision.safetensors").string()));
    DRAY_ASSIGN_OR_RETURN(patches, vision->Get("pixel_values"));
  }
  DRAY_ASSIGN_OR_RETURN(at::Tensor hidden, encoder.forward(ids, mask, patches, grids));
  DRAY_ASSIGN_OR_RETURN(at::Tensor positions,
                        MultimodalPositions(ids, mask, grids, encoder.config()));
  const at::Tensor real = mask.ne(0);
  auto where_real = [&](const at::Tensor& t) { return t.index({real}); };
  Outputs results = {
      CompareTensors(c, "last_hidden_state", where_real(hidden),
                     where_real(file.Get("last_hidden_state").value()), kModelTolerance,
                     kModelTolerance),
      CompareTensors(c, "logits", where_real(encoder.Logits(hidden)),
                     where_real(file.Get("logits").value()), kModelTolerance, kModelTolerance),
      CompareTensors(c, "position_ids", positions, file.Get("position_ids").value(), 0, 0),
      CompareTensors(c, "rope_deltas", RopeDeltas(positions), file.Get("rope_deltas").value(), 0,
                     0)};
  if (file.contains("inputs_embeds")) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor embeds, encoder.EmbedInputs(ids, patches, grids));
    results.push_back(CompareTensors(c, "inputs_embeds", embeds, file.Get("inputs_embeds").value(),
                                     kModelTolerance, kModelTolerance));
  }
  return results;
}

// Images through the vision tower alone, with its window layout and rotary
// angles; stored input images also through the image processor.
absl::StatusOr<Outputs> RunVision(const ParityCase& c, Qwen25VLTextEncoderImpl& encoder,
                                  const SafetensorsFile& file) {
  DRAY_ASSIGN_OR_RETURN(at::Tensor patches, file.Get("pixel_values"));
  const std::vector<ImageGrid> grids = Grids(file.Get("image_grid_thw").value());
  DRAY_ASSIGN_OR_RETURN(at::Tensor embeds, encoder.EncodeImages(patches, grids));
  const VisionConfig& vision = encoder.config().vision;
  const VisionWindowLayout windows = VisionWindows(grids, vision);
  std::vector<int64_t> bounds = {0};
  for (int64_t length : windows.lengths) bounds.push_back(bounds.back() + length);
  Outputs results = {
      CompareTensors(c, "image_embeds", embeds, file.Get("image_embeds").value(), kModelTolerance,
                     kModelTolerance),
      CompareTensors(c, "window_index", at::tensor(windows.order, at::kLong),
                     file.Get("window_index").value(), 0, 0),
      CompareTensors(c, "cu_window_seqlens", at::tensor(bounds, at::kLong),
                     file.Get("cu_window_seqlens").value(), 0, 0),
      CompareTensors(c, "rotary_pos_emb_unpermuted", VisionRotaryAngles(grids, vision),
                     file.Get("rotary_pos_emb_unpermuted").value(), kModelTolerance,
                     kModelTolerance)};
  std::vector<at::Tensor> processed;
  for (int64_t j = 0; file.contains(absl::StrCat("image", j, "_uint8_hwc")); ++j) {
    DRAY_ASSIGN_OR_RETURN(ProcessedImage image,
                          ProcessImage(file.Get(absl::StrCat("image", j, "_uint8_hwc")).value(),
                                       ImageProcessorConfig{}));
    processed.push_back(image.patches);
  }
  if (!processed.empty()) {
    results.push_back(
        CompareTensors(c, "pixel_values", at::cat(processed), patches, kPixelTolerance, 0));
  }
  return results;
}

absl::StatusOr<Outputs> RunModelCase(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(auto file, OpenCase(c));
  DRAY_ASSIGN_OR_RETURN(Qwen25VLTextEncoder encoder,
                        LoadTextEncoder(c.folder, at::TensorOptions().dtype(at::kFloat)));
  encoder->eval();
  if (file->contains("input_ids")) return RunPrompts(c, *encoder, *file);
  return RunVision(c, *encoder, *file);
}

// smart_resize over a table of sizes and budgets; -1 where it raises.
absl::StatusOr<Outputs> RunSmartResizeTable(const ParityCase& c, const SafetensorsFile& file) {
  DRAY_ASSIGN_OR_RETURN(at::Tensor table, file.Get("h_w_min_max_outh_outw"));
  table = table.to(at::kLong).contiguous();
  at::Tensor sizes = at::empty({table.size(0), 2}, at::kLong);
  for (int64_t i = 0; i < table.size(0); ++i) {
    ImageProcessorConfig config;
    config.min_pixels = table[i][2].item<int64_t>();
    config.max_pixels = table[i][3].item<int64_t>();
    const auto resized =
        SmartResize(table[i][0].item<int64_t>(), table[i][1].item<int64_t>(), config);
    sizes[i][0] = resized.ok() ? resized->first : -1;
    sizes[i][1] = resized.ok() ? resized->second : -1;
  }
  return Outputs{CompareTensors(c, "smart_resize", sizes, table.narrow(1, 4, 2), 0, 0)};
}

// One processor call on a list of images: each image's Pillow resize on
// its own (bit for bit), then the patches and grids of the whole call.
absl::StatusOr<Outputs> RunProcessorCase(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(auto file, OpenCase(c));
  if (file->contains("h_w_min_max_outh_outw")) return RunSmartResizeTable(c, *file);
  DRAY_ASSIGN_OR_RETURN(
      ImageProcessorConfig config,
      ImageProcessorConfig::FromFile((fs::path(c.folder) / "preprocessor_config.json").string()));
  auto kwargs = file->metadata().find("processor_kwargs");
  if (kwargs != file->metadata().end()) {
    const json parsed = json::parse(kwargs->second, nullptr, /*allow_exceptions=*/false);
    config.min_pixels = parsed.value("min_pixels", config.min_pixels);
    config.max_pixels = parsed.value("max_pixels", config.max_pixels);
  }
  Outputs results;
  std::vector<at::Tensor> patches, grids, sizes;
  for (int64_t j = 0; file->contains(absl::StrCat("image", j, "_uint8_hwc")); ++j) {
    const at::Tensor image = file->Get(absl::StrCat("image", j, "_uint8_hwc")).value();
    const std::string resized_name = absl::StrCat("image", j, "_resized_uint8_hwc");
    DRAY_ASSIGN_OR_RETURN(at::Tensor expected, file->Get(resized_name));
    DRAY_ASSIGN_OR_RETURN(auto size, SmartResize(image.size(0), image.size(1), config));
    DRAY_ASSIGN_OR_RETURN(at::Tensor resized,
                          ResizeImage(image, size.first, size.second, Resample::kBicubic));
    results.push_back(CompareTensors(c, resized_name, resized, expected, 0, 0));
    DRAY_ASSIGN_OR_RETURN(ProcessedImage processed, ProcessImage(image, config));
    patches.push_back(processed.patches);
    grids.push_back(
        at::tensor(std::vector<int64_t>(processed.grid.begin(), processed.grid.end()), at::kLong));
    sizes.push_back(at::tensor({image.size(0), image.size(1), size.first, size.second}, at::kLong));
  }
  if (patches.empty()) return absl::NotFoundError(absl::StrCat(file->path(), " holds no images"));
  results.push_back(CompareTensors(c, "pixel_values", at::cat(patches),
                                   file->Get("pixel_values").value(), kPixelTolerance, 0));
  results.push_back(CompareTensors(c, "image_grid_thw", at::stack(grids),
                                   file->Get("image_grid_thw").value(), 0, 0));
  results.push_back(CompareTensors(c, "smart_resize_hw_in_out", at::stack(sizes),
                                   file->Get("smart_resize_hw_in_out").value(), 0, 0));
  return results;
}

// What a folder's config says it is: "qwen2_5_vl" for a model,
// "Qwen2VLImageProcessor" for a processor, else empty.
std::string FolderKind(const fs::path& folder) {
  auto read = [&](const char* file, const char* key) -> std::string {
    const absl::StatusOr<json> config = ReadJsonFile((folder / file).string());
    if (!config.ok() || !config->is_object() || !config->contains(key)) return "";
    return (*config)[key].is_string() ? (*config)[key].get<std::string>() : "";
  };
  if (read("config.json", "model_type") == "qwen2_5_vl") return "qwen2_5_vl";
  return read("preprocessor_config.json", "image_processor_type");
}

}  // namespace

std::vector<ParityCase> Qwen2VlParityCases(const std::string& dir) {
  const fs::path folder(dir);
  const std::string kind = FolderKind(folder);
  std::string component;
  ParityRun run;
  if (kind == "qwen2_5_vl") {
    component = absl::StrCat("text_encoder_", folder.filename().string());
    run = RunModelCase;
  } else if (kind == "Qwen2VLImageProcessor") {
    component = "image_processor";
    run = RunProcessorCase;
  } else {
    return {};
  }
  return CaseFilesIn(component, folder.string(), run);
}

}  // namespace dray::qwen2_vl
