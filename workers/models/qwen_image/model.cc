#include "workers/models/qwen_image/model.h"

#include <ATen/ops/empty.h>

#include <filesystem>
#include <fstream>

#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "dispatch/status_macros.h"
#include "runtime/safetensors.h"
#include "workers/models/layers.h"

namespace dray::qwen_image {
namespace {

namespace fs = std::filesystem;

struct Component {
  const char* folder;
  const char* library;
  const char* class_name;
};

constexpr Component kComponents[] = {
    {"scheduler", "diffusers", "FlowMatchEulerDiscreteScheduler"},
    {"transformer", "diffusers", "QwenImageTransformer2DModel"},
    {"vae", "diffusers", "AutoencoderKLQwenImage"},
};

// CheckModelIndex verifies that model_index.json names the components dray loads.
absl::Status CheckModelIndex(const std::string& dir) {
  const std::string path = (fs::path(dir) / "model_index.json").string();
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(dir, " is not a diffusers model directory: no model_index.json"));
  }
  const nlohmann::json index = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, " is not a JSON object"));
  for (const Component& component : kComponents) {
    const nlohmann::json expected = {component.library, component.class_name};
    if (!index.contains(component.folder) || index[component.folder] != expected) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": component '", component.folder, "' must be ",
                                                     expected.dump(), ", found ",
                                                     index.contains(component.folder) ? index[component.folder].dump() : "nothing"));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteText(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text << "\n";
  if (!out.flush()) return absl::UnavailableError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

absl::Status WriteWeights(const fs::path& dir, torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& parameter : module.named_parameters()) tensors.emplace_back(parameter.key(), parameter.value());
  return WriteSafetensors((dir / "diffusion_pytorch_model.safetensors").string(), tensors, {{"format", "pt"}});
}

}  // namespace

absl::StatusOr<QwenImageModel> LoadQwenImageModel(const std::string& dir, at::TensorOptions options) {
  DRAY_RETURN_IF_ERROR(CheckModelIndex(dir));
  const fs::path root(dir);
  QwenImageModel model;
  DRAY_ASSIGN_OR_RETURN(model.scheduler,
                        FlowMatchEulerConfig::FromFile((root / "scheduler" / "scheduler_config.json").string()));
  DRAY_ASSIGN_OR_RETURN(TransformerConfig transformer,
                        TransformerConfig::FromFile((root / "transformer" / "config.json").string()));
  DRAY_ASSIGN_OR_RETURN(VaeConfig vae, VaeConfig::FromFile((root / "vae" / "config.json").string()));
  if (transformer.out_channels != vae.z_dim) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": the transformer predicts ", transformer.out_channels,
                                                   " latent channels, the VAE has z_dim ", vae.z_dim));
  }
  model.transformer = QwenImageTransformer(transformer, options);
  model.vae = AutoencoderKLQwenImage(vae, options);
  DRAY_ASSIGN_OR_RETURN(Checkpoint transformer_weights, Checkpoint::Open((root / "transformer").string()));
  DRAY_RETURN_IF_ERROR(LoadStateDict(*model.transformer, transformer_weights));
  DRAY_ASSIGN_OR_RETURN(Checkpoint vae_weights, Checkpoint::Open((root / "vae").string()));
  DRAY_RETURN_IF_ERROR(LoadStateDict(*model.vae, vae_weights));
  return model;
}

absl::StatusOr<ModelPreset> PresetNamed(const std::string& name) {
  ModelPreset preset;
  preset.scheduler = FlowMatchEulerConfig::QwenImage();
  if (name == "real") return preset;
  if (name == "tiny") {
    preset.transformer = {2, 16, 4, 2, 16, 3, 16, {8, 4, 4}, false};
    preset.vae.base_dim = 24;
    preset.vae.z_dim = 4;
    preset.vae.dim_mult = {1, 2, 4};
    preset.vae.num_res_blocks = 1;
    preset.vae.temperal_downsample = {false, true};
    preset.vae.latents_mean = {0, 0, 0, 0};
    preset.vae.latents_std = {1, 1, 1, 1};
    return preset;
  }
  if (name == "small") {
    preset.transformer = {2, 64, 16, 3, 32, 4, 48, {8, 12, 12}, false};
    preset.vae.base_dim = 12;
    return preset;
  }
  return absl::NotFoundError(absl::StrCat("unknown model preset '", name, "'; presets: tiny, small, real"));
}

absl::Status WriteRandomQwenImageModel(const std::string& dir, const ModelPreset& preset, uint64_t seed) {
  const fs::path root(dir);
  std::error_code error;
  for (const Component& component : kComponents) {
    fs::create_directories(root / component.folder, error);
    if (error) return absl::UnavailableError(absl::StrCat("cannot create ", (root / component.folder).string(), ": ", error.message()));
  }
  nlohmann::json index = {{"_class_name", "QwenImageEditPipeline"}, {"_diffusers_version", kDiffusersVersion}};
  for (const Component& component : kComponents) index[component.folder] = {component.library, component.class_name};
  DRAY_RETURN_IF_ERROR(WriteText(root / "model_index.json", index.dump(2)));
  DRAY_RETURN_IF_ERROR(WriteText(root / "scheduler" / "scheduler_config.json", preset.scheduler.ToJson()));
  DRAY_RETURN_IF_ERROR(WriteText(root / "transformer" / "config.json", preset.transformer.ToJson()));
  DRAY_RETURN_IF_ERROR(WriteText(root / "vae" / "config.json", preset.vae.ToJson()));

  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  QwenImageTransformer transformer(preset.transformer, at::TensorOptions().dtype(at::kFloat));
  InitializeLikePyTorch(*transformer, generator);
  DRAY_RETURN_IF_ERROR(WriteWeights(root / "transformer", *transformer));
  AutoencoderKLQwenImage vae(preset.vae, at::TensorOptions().dtype(at::kFloat));
  InitializeLikePyTorch(*vae, generator);
  return WriteWeights(root / "vae", *vae);
}

}  // namespace dray::qwen_image
