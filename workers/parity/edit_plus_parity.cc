#include "workers/parity/edit_plus_parity.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "runtime/io/safetensors.h"
#include "workers/models/image_resize.h"
#include "workers/models/model_index.h"
#include "workers/models/qwen2_vl/image_processor.h"
#include "workers/models/qwen_image/edit_pipeline.h"
#include "workers/models/qwen_image/model.h"
#include "workers/models/qwen_image/pipeline_helpers.h"

namespace dray::qwen_image {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Outputs = std::vector<ParityResult>;

constexpr double kTolerance = 1e-5;
constexpr int64_t kCrop = 32;  // the README's crops: 32x32 pixels

absl::StatusOr<std::shared_ptr<const SafetensorsFile>> OpenCase(const ParityCase& c) {
  return SafetensorsFile::Open((fs::path(c.folder) / (c.name + ".safetensors")).string());
}

// CaseEntry: the case's entry in its folder's cases.json.
absl::StatusOr<json> CaseEntry(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(json cases, ReadJsonFile((fs::path(c.folder) / "cases.json").string()));
  for (const json& entry : cases.at("cases")) {
    if ("case_" + entry.at("case").get<std::string>() == c.name) return entry;
  }
  return absl::NotFoundError(absl::StrCat(c.folder, "/cases.json has no case ", c.name));
}

// Metadata: a JSON value of the case file's metadata.
absl::StatusOr<json> Metadata(const SafetensorsFile& file, const std::string& key) {
  auto it = file.metadata().find(key);
  if (it == file.metadata().end())
    return absl::NotFoundError(absl::StrCat(file.path(), ": no metadata ", key));
  json value = json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded())
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": metadata ", key, " is not JSON"));
  return value;
}

// InputImages: image0_uint8_hwc, image1_uint8_hwc, ... as stored.
std::vector<at::Tensor> InputImages(const SafetensorsFile& file) {
  std::vector<at::Tensor> images;
  for (int j = 0; file.contains(absl::StrCat("image", j, "_uint8_hwc")); ++j)
    images.push_back(file.Get(absl::StrCat("image", j, "_uint8_hwc")).value().contiguous());
  return images;
}

// LoadModel loads `../model` beside the case's folder in float32; with
// zero_cond_t, as Qwen-Image-Edit-2511 configures its transformer.
absl::StatusOr<QwenImageModel> LoadModel(const ParityCase& c, bool zero_cond_t = false) {
  const fs::path model = fs::path(c.folder).parent_path() / "model";
  if (!zero_cond_t) return LoadQwenImageModel(model.string(), at::TensorOptions(at::kFloat));
  DRAY_ASSIGN_OR_RETURN(ScratchDir copy, ScratchDir::Create("dray-edit-plus-2511"));
  std::error_code error;
  fs::copy(model, copy.path(), fs::copy_options::recursive, error);
  if (error) return absl::InternalError(absl::StrCat("cannot copy ", model.string()));
  const std::string config = copy.path() + "/transformer/config.json";
  DRAY_ASSIGN_OR_RETURN(json transformer, ReadJsonFile(config));
  transformer["zero_cond_t"] = true;
  DRAY_RETURN_IF_ERROR(WriteFile(config, transformer.dump(2)));
  return LoadQwenImageModel(copy.path(), at::TensorOptions(at::kFloat));
}

at::Tensor Sizes(const std::vector<std::pair<int64_t, int64_t>>& sizes) {
  std::vector<int64_t> flat;
  for (const auto& [w, h] : sizes) flat.insert(flat.end(), {w, h});
  return at::tensor(flat, at::kLong).reshape({-1, 2});
}

at::Tensor Exact(const at::Tensor& t) { return t.to(at::kLong); }

// CompareResized compares a resized image's three 32x32 crops (top left,
// centre, bottom right) and channel sums with the reference's.
void CompareResized(const ParityCase& c, const SafetensorsFile& file, const std::string& name,
                    const at::Tensor& image, Outputs& results) {
  const int64_t h = image.size(0), w = image.size(1);
  const std::pair<int64_t, int64_t> origins[] = {
      {0, 0}, {(h - kCrop) / 2, (w - kCrop) / 2}, {h - kCrop, w - kCrop}};
  const char* where[] = {"tl", "c", "br"};
  for (int k = 0; k < 3; ++k) {
    const std::string crop = absl::StrCat(name, "_crop_", where[k], "_uint8");
    const at::Tensor mine =
        image.narrow(0, origins[k].first, kCrop).narrow(1, origins[k].second, kCrop);
    results.push_back(CompareTensors(c, crop, Exact(mine), Exact(file.Get(crop).value()), 0, 0));
  }
  const std::string sums = name + "_channel_sums";
  results.push_back(CompareTensors(c, sums, image.to(at::kLong).sum(at::IntArrayRef{0, 1}),
                                   Exact(file.Get(sums).value()), 0, 0));
}

// PromptIds: the prompt's token ids for `images` (resized for the text
// encoder) as the pipeline builds them, and their grids.
absl::StatusOr<std::pair<at::Tensor, at::Tensor>> PromptIds(const QwenImageModel& model,
                                                            const std::string& prompt,
                                                            const std::vector<at::Tensor>& images) {
  std::vector<int64_t> tokens;
  std::vector<at::Tensor> grids;
  for (const at::Tensor& image : images) {
    DRAY_ASSIGN_OR_RETURN(qwen2_vl::ProcessedImage processed,
                          qwen2_vl::ProcessImage(image, model.image_processor));
    tokens.push_back(processed.tokens(model.image_processor));
    grids.push_back(
        at::tensor(std::vector<int64_t>(processed.grid.begin(), processed.grid.end()), at::kLong));
  }
  DRAY_ASSIGN_OR_RETURN(
      std::vector<int64_t> ids,
      ExpandImagePads(EncodeEditPrompt(*model.tokenizer, prompt, EditPipelineKind::kEditPlus,
                                       static_cast<int>(images.size())),
                      model.text_encoder->config().image_token_id, tokens));
  return std::make_pair(at::tensor(ids, at::kLong).unsqueeze(0), at::stack(grids));
}

// ResizeAll resizes each image to its {width, height}.
absl::StatusOr<std::vector<at::Tensor>> ResizeAll(
    const std::vector<at::Tensor>& images, const std::vector<std::pair<int64_t, int64_t>>& sizes) {
  std::vector<at::Tensor> resized;
  for (size_t j = 0; j < images.size(); ++j) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor image, ResizeImage(images[j], sizes[j].second, sizes[j].first,
                                                        Resample::kLanczos));
    resized.push_back(image);
  }
  return resized;
}

absl::StatusOr<Outputs> RunPreprocess(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(auto file, OpenCase(c));
  DRAY_ASSIGN_OR_RETURN(json entry, CaseEntry(c));
  DRAY_ASSIGN_OR_RETURN(QwenImageModel loaded, LoadModel(c));
  QwenImageEditPipeline pipeline(std::move(loaded));
  const QwenImageModel& model = pipeline.model();
  const json& call = entry.at("call");
  const std::vector<at::Tensor> images = InputImages(*file);
  EditOptions options;  // the released sizes
  if (call.contains("width")) options.width = call.at("width").get<int64_t>();
  if (call.contains("height")) options.height = call.at("height").get<int64_t>();
  DRAY_ASSIGN_OR_RETURN(
      EditSizes sizes,
      ComputeEditSizes(images, options, EditPipelineKind::kEditPlus, pipeline.vae_scale_factor()));
  std::vector<std::pair<int64_t, int64_t>> condition_wh, vae_wh;
  for (const json& image : entry.at("images")) {
    condition_wh.push_back({image.at("condition_wh")[0], image.at("condition_wh")[1]});
    vae_wh.push_back({image.at("vae_wh")[0], image.at("vae_wh")[1]});
  }
  Outputs results;
  results.push_back(
      CompareTensors(c, "condition_wh", Sizes(sizes.prompt), Sizes(condition_wh), 0, 0));
  results.push_back(CompareTensors(c, "vae_wh", Sizes(sizes.vae), Sizes(vae_wh), 0, 0));
  results.push_back(CompareTensors(
      c, "output_hw", at::tensor({sizes.height, sizes.width}, at::kLong),
      at::tensor(
          {entry.at("output_height").get<int64_t>(), entry.at("output_width").get<int64_t>()},
          at::kLong),
      0, 0));
  DRAY_ASSIGN_OR_RETURN(std::vector<at::Tensor> for_prompt, ResizeAll(images, sizes.prompt));
  DRAY_ASSIGN_OR_RETURN(std::vector<at::Tensor> for_vae, ResizeAll(images, sizes.vae));
  for (size_t j = 0; j < images.size(); ++j) {
    CompareResized(c, *file, absl::StrCat("image", j, "_condition"), for_prompt[j], results);
    CompareResized(c, *file, absl::StrCat("image", j, "_vae"), for_vae[j], results);
  }
  for (const auto& [side, prompt] :
       {std::pair<std::string, std::string>{"prompt", call.at("prompt")},
        {"negative", call.at("negative_prompt")}}) {
    DRAY_ASSIGN_OR_RETURN(auto ids_and_grids, PromptIds(model, prompt, for_prompt));
    const at::Tensor& ids = ids_and_grids.first;
    results.push_back(CompareTensors(c, side + ".input_ids", ids,
                                     Exact(file->Get(side + ".input_ids").value()), 0, 0));
    results.push_back(CompareTensors(c, side + ".attention_mask", at::ones_like(ids),
                                     Exact(file->Get(side + ".attention_mask").value()), 0, 0));
    results.push_back(CompareTensors(c, side + ".image_grid_thw", ids_and_grids.second,
                                     Exact(file->Get(side + ".image_grid_thw").value()), 0, 0));
  }
  return results;
}

absl::StatusOr<Outputs> RunEncodePrompt(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(auto file, OpenCase(c));
  DRAY_ASSIGN_OR_RETURN(json call, Metadata(*file, "call"));
  const json& kwargs = call.at("kwargs");
  DRAY_ASSIGN_OR_RETURN(QwenImageModel model, LoadModel(c));
  QwenImageEditPipeline pipeline(std::move(model));
  const std::vector<at::Tensor> images = InputImages(*file);
  std::vector<at::Tensor> condition;
  if (!images.empty()) {
    DRAY_ASSIGN_OR_RETURN(EditSizes sizes, ComputeEditSizes(images, {}, EditPipelineKind::kEditPlus,
                                                            pipeline.vae_scale_factor()));
    DRAY_ASSIGN_OR_RETURN(condition, ResizeAll(images, sizes.prompt));
  }
  std::vector<std::string> prompts;
  if (kwargs.at("prompt").is_array()) {
    prompts = kwargs.at("prompt").get<std::vector<std::string>>();
  } else {
    prompts.push_back(kwargs.at("prompt").get<std::string>());
  }
  Outputs results;
  const std::vector<std::vector<at::Tensor>> rows(prompts.size(), condition);
  DRAY_ASSIGN_OR_RETURN(PromptEmbeddings embeddings, pipeline.EncodePrompts(prompts, rows));
  results.push_back(CompareTensors(c, "prompt.prompt_embeds", embeddings.embeds,
                                   file->Get("prompt.prompt_embeds").value(), kTolerance,
                                   kTolerance));
  if (file->contains("prompt.prompt_embeds_mask")) {
    results.push_back(CompareTensors(c, "prompt.prompt_embeds_mask", embeddings.mask,
                                     Exact(file->Get("prompt.prompt_embeds_mask").value()), 0, 0));
  }
  const json& negative = kwargs.at("negative(second call)");
  if (negative.is_string()) {
    DRAY_ASSIGN_OR_RETURN(PromptEmbeddings negatives,
                          pipeline.EncodePrompts({negative.get<std::string>()}, rows));
    results.push_back(CompareTensors(c, "negative.prompt_embeds", negatives.embeds,
                                     file->Get("negative.prompt_embeds").value(), kTolerance,
                                     kTolerance));
  }
  return results;
}

// Side: `prepared` with only its conditional (or only its negative) prompt.
PreparedEdit Side(const PreparedEdit& prepared, bool negative) {
  PreparedEdit side = prepared;
  if (negative) side.prompt = *prepared.negative;
  side.negative.reset();
  return side;
}

// EditOptionsOf: the case's call as dray's options. Edit-Plus cases shrink
// diffusers' module constants VAE_IMAGE_SIZE and CONDITION_IMAGE_SIZE (areas);
// Edit cases shrink the 1024^2 working area; height and width may be absent.
absl::StatusOr<EditOptions> EditOptionsOf(const SafetensorsFile& file, EditPipelineKind kind) {
  DRAY_ASSIGN_OR_RETURN(json call, Metadata(file, "call"));
  EditOptions options;
  options.num_inference_steps = call.at("num_inference_steps");
  options.true_cfg_scale = call.at("true_cfg_scale");
  options.negative_prompt = call.at("negative_prompt").get<std::string>();
  auto side = [](const json& area) { return std::lround(std::sqrt(area.get<double>())); };
  if (kind == EditPipelineKind::kEditPlus) {
    DRAY_ASSIGN_OR_RETURN(json overrides, Metadata(file, "module_overrides"));
    options.image_size = side(overrides.at("VAE_IMAGE_SIZE"));
    options.condition_image_size = side(overrides.at("CONDITION_IMAGE_SIZE"));
  } else {
    DRAY_ASSIGN_OR_RETURN(json area, Metadata(file, "edit_area_override"));
    options.image_size = side(area);
  }
  if (call.contains("width")) options.width = call.at("width").get<int64_t>();
  if (call.contains("height")) options.height = call.at("height").get<int64_t>();
  return options;
}

// RunEndToEnd: one full pipeline call of `kind` on the case's model, every
// intermediate diffusers recorded compared.
absl::StatusOr<Outputs> RunEndToEnd(const ParityCase& c, EditPipelineKind kind) {
  DRAY_ASSIGN_OR_RETURN(auto file, OpenCase(c));
  DRAY_ASSIGN_OR_RETURN(json call, Metadata(*file, "call"));
  DRAY_ASSIGN_OR_RETURN(json transformer, Metadata(*file, "transformer_config_override"));
  DRAY_ASSIGN_OR_RETURN(json seed, Metadata(*file, "case_seed"));
  DRAY_ASSIGN_OR_RETURN(EditOptions options, EditOptionsOf(*file, kind));
  DRAY_ASSIGN_OR_RETURN(QwenImageModel model,
                        LoadModel(c, transformer.value("zero_cond_t", false)));
  model.pipeline = kind;
  QwenImageEditPipeline pipeline(std::move(model));
  const EditInput input{InputImages(*file), call.at("prompt").get<std::string>(),
                        seed.get<uint64_t>()};
  DRAY_ASSIGN_OR_RETURN(PreparedEdit prepared, pipeline.Prepare({&input}, options));

  Outputs results;
  auto compare = [&](const std::string& output, const at::Tensor& mine) {
    results.push_back(
        CompareTensors(c, output, mine, file->Get(output).value(), kTolerance, kTolerance));
  };
  compare("prompt.prompt_embeds", prepared.prompt.embeds);
  compare("negative.prompt_embeds", prepared.negative->embeds);
  compare("image_latents", prepared.image_latents);
  compare("latents_initial", prepared.noise);
  DRAY_ASSIGN_OR_RETURN(FlowMatchEulerScheduler scheduler,
                        pipeline.Scheduler(prepared.noise.size(1), options.num_inference_steps));
  at::Tensor latents = prepared.noise;
  for (int i = 0; i < options.num_inference_steps; ++i) {
    const std::string step = absl::StrCat("step", i, ".");
    const at::Tensor timestep = scheduler.timesteps()[i].expand({1});
    compare(step + "timestep_input", timestep / 1000);
    for (bool negative : {false, true}) {
      DRAY_ASSIGN_OR_RETURN(at::Tensor side, pipeline.Velocity(Side(prepared, negative), latents,
                                                               timestep, options.true_cfg_scale));
      compare(step + (negative ? "noise_pred_uncond" : "noise_pred_cond"), side);
    }
    DRAY_ASSIGN_OR_RETURN(at::Tensor velocity,
                          pipeline.Velocity(prepared, latents, timestep, options.true_cfg_scale));
    DRAY_ASSIGN_OR_RETURN(latents, scheduler.Step(velocity, latents));
    compare(step + "latents", latents);
  }
  compare("latents_final", latents);
  // The decoded image before rounding to 8 bits: diffusers' output_type "np".
  AutoencoderKLQwenImage& vae = pipeline.model().vae;
  DRAY_ASSIGN_OR_RETURN(at::Tensor unpacked, UnpackLatents(latents, prepared.height, prepared.width,
                                                           pipeline.vae_scale_factor()));
  const at::Tensor vae_input = vae->Denormalize(unpacked);
  compare("vae_decode_input", vae_input);
  DRAY_ASSIGN_OR_RETURN(at::Tensor decoded, vae->Decode(vae_input));
  compare("image_np", (decoded.select(2, 0) / 2 + 0.5).clamp(0, 1).permute({0, 2, 3, 1}));
  return results;
}

}  // namespace

std::vector<ParityCase> EditPlusParityCases(const std::string& dir) {
  const fs::path folder(dir);
  const std::string pipeline = ModelPipelineClass(dir);
  if (pipeline != kQwenImageEditPipeline && pipeline != kQwenImageEditPlusPipeline) return {};
  const std::string name = folder.filename().string();
  std::string component;
  ParityRun run;
  if (name == "preprocess") {
    component = "edit_plus_preprocess";
    run = RunPreprocess;
  } else if (name == "encode_prompt") {
    component = "edit_plus_encode_prompt";
    run = RunEncodePrompt;
  } else if (name == "e2e_plus") {
    component = "edit_plus_e2e";
    run = [](const ParityCase& c) { return RunEndToEnd(c, EditPipelineKind::kEditPlus); };
  } else if (name == "e2e_edit") {
    component = "edit_e2e";
    run = [](const ParityCase& c) { return RunEndToEnd(c, EditPipelineKind::kEdit); };
  } else {
    return {};
  }
  return CaseFilesIn(component, folder.string(), run);
}

}  // namespace dray::qwen_image
