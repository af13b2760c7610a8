#include "workers/models/flux/model.h"

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <optional>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "runtime/io/safetensors.h"
#include "workers/models/component_weights.h"
#include "workers/models/model_index.h"

// The tiny tokenizers' files (tiny_tokenizers.safetensors), carried by the binary.
extern const char dray_flux_tiny_tokenizers_start[];
extern const char dray_flux_tiny_tokenizers_end[];

namespace dray::flux {
namespace {

namespace fs = std::filesystem;

// kComponents: what a FLUX.1 Kontext model_index.json names.
const ModelComponent kComponents[] = {
    {"scheduler", {{"diffusers", "FlowMatchEulerDiscreteScheduler"}}},
    {"transformer", {{"diffusers", "FluxTransformer2DModel"}}},
    {"vae", {{"diffusers", "AutoencoderKL"}}},
    {"text_encoder", {{"transformers", "CLIPTextModel"}}},
    {"text_encoder_2", {{"transformers", "T5EncoderModel"}}},
    {"tokenizer", {{"transformers", "CLIPTokenizer"}, {"transformers", "CLIPTokenizerFast"}}},
    {"tokenizer_2", {{"transformers", "T5Tokenizer"}, {"transformers", "T5TokenizerFast"}}},
};

// CheckSizes: the components fit together.
absl::Status CheckSizes(const std::string& dir, const FluxTransformerConfig& transformer,
                        const AutoencoderKLConfig& vae, int64_t clip_width, int64_t t5_width) {
  if (transformer.in_channels != 4 * vae.latent_channels ||
      transformer.output_channels() != transformer.in_channels) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": the transformer takes and predicts ", transformer.in_channels, " and ",
                     transformer.output_channels(), " packed channels; the VAE's ",
                     vae.latent_channels, " latent channels pack to ", 4 * vae.latent_channels));
  }
  if (clip_width != transformer.pooled_projection_dim ||
      t5_width != transformer.joint_attention_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": the text encoders' widths (CLIP ", clip_width, ", T5 ", t5_width,
        ") differ from the transformer's pooled_projection_dim ", transformer.pooled_projection_dim,
        " and joint_attention_dim ", transformer.joint_attention_dim));
  }
  return absl::OkStatus();
}

// WriteRandomWeights writes `module`, initialized as PyTorch would from `seed`.
absl::Status WriteRandomWeights(const fs::path& file, torch::nn::Module& module, uint64_t seed) {
  InitializeLikePyTorch(module, at::make_generator<at::CPUGeneratorImpl>(seed));
  return WriteComponentWeights(file.string(), module);
}

// WriteTinyTokenizers writes the embedded tokenizer files into `root`
// (tokenizer/ and tokenizer_2/).
absl::Status WriteTinyTokenizers(const fs::path& root) {
  const fs::path packed = root / "tokenizers.safetensors";
  DRAY_RETURN_IF_ERROR(WriteFile(
      packed.string(),
      absl::string_view(dray_flux_tiny_tokenizers_start,
                        dray_flux_tiny_tokenizers_end - dray_flux_tiny_tokenizers_start)));
  DRAY_ASSIGN_OR_RETURN(std::shared_ptr<const SafetensorsFile> files,
                        SafetensorsFile::Open(packed.string()));
  for (const std::string& name : files->names()) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor bytes, files->Get(name));
    std::error_code error;
    fs::create_directories((root / name).parent_path(), error);
    DRAY_RETURN_IF_ERROR(
        WriteFile((root / name).string(),
                  absl::string_view(static_cast<const char*>(bytes.data_ptr()), bytes.numel())));
  }
  std::error_code error;
  fs::remove(packed, error);
  return absl::OkStatus();
}

nlohmann::json NewKontextModelIndex() {
  nlohmann::json index = NewModelIndex(kFluxKontextPipeline, kComponents);
  index["feature_extractor"] = {nullptr, nullptr};
  index["image_encoder"] = {nullptr, nullptr};
  return index;
}

}  // namespace

absl::StatusOr<FluxKontextModel> LoadFluxKontextModel(const std::string& dir,
                                                      at::TensorOptions options, Weights weights) {
  const fs::path root(dir);
  DRAY_ASSIGN_OR_RETURN(ModelIndex index, ReadModelIndex(dir));
  if (index.pipeline() != kFluxKontextPipeline) {
    return absl::InvalidArgumentError(absl::StrCat(index.path, ": _class_name must be ",
                                                   kFluxKontextPipeline, ", found \"",
                                                   index.pipeline(), "\""));
  }
  DRAY_RETURN_IF_ERROR(index.CheckComponents(kComponents));
  FluxKontextModel model;
  DRAY_ASSIGN_OR_RETURN(model.scheduler,
                        qwen_image::FlowMatchEulerConfig::FromFile(
                            (root / "scheduler" / "scheduler_config.json").string()));
  DRAY_ASSIGN_OR_RETURN(
      FluxTransformerConfig transformer,
      FluxTransformerConfig::FromFile((root / "transformer" / "config.json").string()));
  DRAY_ASSIGN_OR_RETURN(AutoencoderKLConfig vae,
                        AutoencoderKLConfig::FromFile((root / "vae" / "config.json").string()));
  DRAY_ASSIGN_OR_RETURN(
      model.clip, clip::LoadClipTextModel((root / "text_encoder").string(), options, weights));
  DRAY_ASSIGN_OR_RETURN(model.t5,
                        t5::LoadT5Encoder((root / "text_encoder_2").string(), options, weights));
  DRAY_RETURN_IF_ERROR(CheckSizes(dir, transformer, vae, model.clip->config().hidden_size,
                                  model.t5->config().d_model));
  {
    std::optional<DeferredAllocation> deferred;
    if (weights == Weights::kShapeOnly) deferred.emplace();
    model.transformer = FluxTransformer(transformer, options);
    model.vae = AutoencoderKL(vae, options);
  }
  if (weights == Weights::kRead) {
    DRAY_ASSIGN_OR_RETURN(Checkpoint transformer_weights,
                          OpenComponentWeights((root / "transformer").string()));
    DRAY_RETURN_IF_ERROR(LoadStateDict(*model.transformer, transformer_weights));
    DRAY_ASSIGN_OR_RETURN(Checkpoint vae_weights, OpenComponentWeights((root / "vae").string()));
    DRAY_RETURN_IF_ERROR(LoadStateDict(*model.vae, vae_weights));
  }
  DRAY_ASSIGN_OR_RETURN(clip::Tokenizer clip_tokenizer,
                        clip::Tokenizer::FromDirectory((root / "tokenizer").string()));
  model.clip_tokenizer = std::make_shared<const clip::Tokenizer>(std::move(clip_tokenizer));
  DRAY_ASSIGN_OR_RETURN(t5::Tokenizer t5_tokenizer,
                        t5::Tokenizer::FromDirectory((root / "tokenizer_2").string()));
  model.t5_tokenizer = std::make_shared<const t5::Tokenizer>(std::move(t5_tokenizer));
  return model;
}

absl::StatusOr<FluxPreset> FluxPresetNamed(const std::string& name) {
  FluxPreset preset;
  // FLUX.1's schedule: diffusers' defaults (base 0.5 at 256 tokens, 1.15 at
  // 4096) with dynamic shifting.
  preset.scheduler.shift = 3.0;
  preset.scheduler.use_dynamic_shifting = true;
  preset.transformer.guidance_embeds = true;
  if (name == "flux-real") {
    preset.clip.hidden_size = 768;
    preset.clip.intermediate_size = 3072;
    preset.clip.num_attention_heads = 12;
    preset.clip.eos_token_id = 2;
    preset.t5.d_model = 4096;
    preset.t5.d_ff = 10240;
    preset.t5.num_layers = 24;
    preset.t5.num_heads = 64;
    return preset;
  }
  if (name != "flux-tiny") {
    return absl::NotFoundError(
        absl::StrCat("no FLUX preset named '", name, "' (flux-tiny or flux-real)"));
  }
  // The reference vectors' sizes (tests/data/reference/flux_kontext/model).
  preset.transformer.num_layers = 1;
  preset.transformer.num_single_layers = 2;
  preset.transformer.attention_head_dim = 16;
  preset.transformer.num_attention_heads = 2;
  preset.transformer.joint_attention_dim = 32;
  preset.transformer.pooled_projection_dim = 32;
  preset.transformer.axes_dims_rope = {4, 6, 6};
  preset.vae.block_out_channels = {8, 16, 16};
  preset.vae.layers_per_block = 1;
  preset.vae.norm_num_groups = 4;
  preset.vae.sample_size = 64;
  preset.clip.vocab_size = 1000;
  preset.clip.hidden_size = 32;
  preset.clip.intermediate_size = 64;
  preset.clip.num_hidden_layers = 2;
  preset.clip.num_attention_heads = 4;
  preset.clip.eos_token_id = 2;
  preset.t5.vocab_size = 500;
  preset.t5.d_model = 32;
  preset.t5.d_kv = 8;
  preset.t5.d_ff = 48;
  preset.t5.num_layers = 2;
  preset.t5.num_heads = 4;
  return preset;
}

absl::Status WriteRandomFluxKontextModel(const std::string& dir, const FluxPreset& preset,
                                         uint64_t seed) {
  const fs::path root(dir);
  DRAY_RETURN_IF_ERROR(WriteModelIndex(dir, NewKontextModelIndex(), kComponents));
  for (const auto& [file, json] : std::initializer_list<std::pair<const char*, std::string>>{
           {"scheduler/scheduler_config.json", preset.scheduler.ToJson()},
           {"transformer/config.json", preset.transformer.ToJson()},
           {"vae/config.json", preset.vae.ToJson()},
           {"text_encoder/config.json", preset.clip.ToJson()},
           {"text_encoder_2/config.json", preset.t5.ToJson()}}) {
    DRAY_RETURN_IF_ERROR(WriteComponentConfig((root / file).string(), json));
  }
  DRAY_RETURN_IF_ERROR(WriteTinyTokenizers(root));
  const at::TensorOptions options = at::TensorOptions().dtype(at::kFloat);
  FluxTransformer transformer(preset.transformer, options);
  DRAY_RETURN_IF_ERROR(WriteRandomWeights(
      root / "transformer" / "diffusion_pytorch_model.safetensors", *transformer, seed));
  AutoencoderKL vae(preset.vae, options);
  DRAY_RETURN_IF_ERROR(
      WriteRandomWeights(root / "vae" / "diffusion_pytorch_model.safetensors", *vae, seed + 1));
  clip::ClipTextModel clip(preset.clip, options);
  DRAY_RETURN_IF_ERROR(
      WriteRandomWeights(root / "text_encoder" / "model.safetensors", *clip, seed + 2));
  t5::T5Encoder t5(preset.t5, options);
  return WriteRandomWeights(root / "text_encoder_2" / "model.safetensors", *t5, seed + 3);
}

}  // namespace dray::flux
