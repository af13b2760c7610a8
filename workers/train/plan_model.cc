#include "workers/train/plan_model.h"

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <initializer_list>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "workers/models/flux/model.h"
#include "workers/models/lora.h"
#include "workers/models/model_index.h"
#include "workers/models/qwen_image/model.h"
#include "workers/train/train_config.h"

namespace dray {
namespace {

// kShapes: parameters with shapes and no memory, to which adapters attach
// as to real ones.
const at::TensorOptions kShapes = at::TensorOptions().dtype(at::kFloat).device(at::kMeta);

using Paths = std::initializer_list<const char*>;

// BlockRoles: the layers (paths within a block) whose training decides
// what the block keeps for backward (BlockTraining's fields).
struct BlockRoles {
  Paths modulation, projections, qk_norms, attention_out, mlp_in, mlp_out;
};

constexpr Paths kProjections = {"attn.to_q",       "attn.to_k",       "attn.to_v",
                                "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"};
constexpr Paths kQkNorms = {"attn.norm_q", "attn.norm_k", "attn.norm_added_q", "attn.norm_added_k"};
constexpr Paths kAttentionOut = {"attn.to_out.0", "attn.to_add_out"};

const BlockRoles kFluxDual = {{"norm1.linear", "norm1_context.linear"},
                              kProjections,
                              kQkNorms,
                              kAttentionOut,
                              {"ff.net.0.proj", "ff_context.net.0.proj"},
                              {"ff.net.2", "ff_context.net.2"}};
const BlockRoles kFluxSingle = {{"norm.linear"},
                                {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"},
                                {"attn.norm_q", "attn.norm_k"},
                                {"proj_out"},
                                {},
                                {}};
const BlockRoles kQwenDual = {{"img_mod.1", "txt_mod.1"},
                              kProjections,
                              kQkNorms,
                              kAttentionOut,
                              {"img_mlp.net.0.proj", "txt_mlp.net.0.proj"},
                              {"img_mlp.net.2", "txt_mlp.net.2"}};

// TrainsAny: whether a parameter under one of `paths` of `block` (its own
// weights, or a LoRA adapter on it) requires grad.
bool TrainsAny(const torch::nn::Module& block, Paths paths) {
  for (const auto& named : block.named_parameters()) {
    if (!named.value().requires_grad()) continue;
    for (const char* path : paths) {
      if (absl::StartsWith(named.key(), absl::StrCat(path, "."))) return true;
    }
  }
  return false;
}

PlanUnit CountBlock(const torch::nn::Module& block, BlockKind kind, const BlockRoles& roles) {
  PlanUnit unit;
  unit.kind = kind;
  for (const at::Tensor& parameter : block.parameters())
    (parameter.requires_grad() ? unit.trainable : unit.frozen) += parameter.numel();
  unit.training = {TrainsAny(block, roles.modulation), TrainsAny(block, roles.projections),
                   TrainsAny(block, roles.qk_norms),   TrainsAny(block, roles.attention_out),
                   TrainsAny(block, roles.mlp_in),     TrainsAny(block, roles.mlp_out)};
  return unit;
}

// AttachLora adds the adapters `lora` asks for (none for full fine-tuning).
absl::Status AttachLora(torch::nn::Module& transformer, const LoraPlan& lora,
                        const std::vector<std::string>& default_targets) {
  if (lora.rank == 0) return absl::OkStatus();
  const LoraOptions options{lora.rank, static_cast<double>(lora.rank),
                            lora.target_modules.empty() ? default_targets : lora.target_modules};
  return AddLoraAdapters(transformer, options, at::make_generator<at::CPUGeneratorImpl>(0))
      .status();
}

// CountReplicated: the transformer's parameters outside its blocks.
void CountReplicated(const torch::nn::Module& transformer, PlanModel& model) {
  int64_t trainable = 0, frozen = 0;
  for (const at::Tensor& parameter : transformer.parameters())
    (parameter.requires_grad() ? trainable : frozen) += parameter.numel();
  for (const PlanUnit& unit : model.units) {
    trainable -= unit.trainable;
    frozen -= unit.frozen;
  }
  model.replicated_trainable = trainable;
  model.replicated_frozen = frozen;
  model.embedders_train = trainable > 0;
}

absl::StatusOr<PlanModel> CountFlux(const std::string& name, flux::FluxKontextModel kontext,
                                    const LoraPlan& lora) {
  DRAY_RETURN_IF_ERROR(AttachLora(*kontext.transformer, lora, flux::DiffusersLoraTargets()));
  PlanModel model =
      CountFluxTransformer(absl::StrCat("FLUX.1 Kontext (", name, ")"), *kontext.transformer);
  model.frozen = {{"T5 encoder (text_encoder_2)", ParameterCount(*kontext.t5), true},
                  {"CLIP text encoder (text_encoder)", ParameterCount(*kontext.clip), true},
                  {"VAE", ParameterCount(*kontext.vae), false}};
  return model;
}

absl::StatusOr<PlanModel> CountQwen(const std::string& name, qwen_image::QwenImageModel qwen,
                                    const LoraPlan& lora) {
  qwen_image::QwenImageTransformerImpl& transformer = *qwen.transformer;
  DRAY_RETURN_IF_ERROR(AttachLora(transformer, lora, TrainConfig().lora_target_modules));
  PlanModel model;
  model.name = absl::StrCat("Qwen-Image-Edit (", name, ")");
  for (const auto& block : *transformer.blocks())
    model.units.push_back(CountBlock(*block, BlockKind::kDualStream, kQwenDual));
  CountReplicated(transformer, model);
  const qwen_image::TransformerConfig& config = transformer.config();
  model.dim = config.inner_dim();
  model.heads = config.num_attention_heads;
  model.text_dim = config.joint_attention_dim;
  model.latent_channels = config.in_channels;
  // The text stream carries the prompt and the encoder's tokens of the
  // condition image: about 1024 at 1024^2 (Edit-Plus: ~190 a picture).
  model.default_text_tokens = 1024;
  model.frozen = {{"Qwen2.5-VL (text_encoder)", ParameterCount(*qwen.text_encoder), true},
                  {"VAE", ParameterCount(*qwen.vae), false}};
  model.text_encoders = Placement::kSharded;  // as dray train's workers shard it
  return model;
}

absl::StatusOr<PlanModel> FluxPreset(const std::string& name, const LoraPlan& lora) {
  DRAY_ASSIGN_OR_RETURN(flux::FluxPreset preset, flux::FluxPresetNamed(name));
  flux::FluxKontextModel kontext;
  kontext.transformer = flux::FluxTransformer(preset.transformer, kShapes);
  kontext.vae = flux::AutoencoderKL(preset.vae, kShapes);
  kontext.clip = clip::ClipTextModel(preset.clip, kShapes);
  kontext.t5 = t5::T5Encoder(preset.t5, kShapes);
  return CountFlux(name, std::move(kontext), lora);
}

absl::StatusOr<PlanModel> QwenPreset(const std::string& name, const LoraPlan& lora) {
  DRAY_ASSIGN_OR_RETURN(qwen_image::ModelPreset preset, qwen_image::PresetNamed(name));
  qwen_image::QwenImageModel qwen;
  qwen.transformer = qwen_image::QwenImageTransformer(preset.transformer, kShapes);
  qwen.vae = qwen_image::AutoencoderKLQwenImage(preset.vae, kShapes);
  qwen.text_encoder = qwen2_vl::Qwen25VLTextEncoder(preset.text_encoder, kShapes);
  return CountQwen(name, std::move(qwen), lora);
}

absl::StatusOr<PlanModel> ModelDirectory(const std::string& dir, const LoraPlan& lora) {
  DRAY_ASSIGN_OR_RETURN(ModelFamily family, ReadModelFamily(dir));
  if (family == ModelFamily::kFluxKontext) {
    DRAY_ASSIGN_OR_RETURN(flux::FluxKontextModel kontext,
                          flux::LoadFluxKontextModel(dir, kShapes, Weights::kShapeOnly));
    return CountFlux(dir, std::move(kontext), lora);
  }
  DRAY_ASSIGN_OR_RETURN(qwen_image::QwenImageModel qwen,
                        qwen_image::LoadQwenImageModel(dir, kShapes, Weights::kShapeOnly));
  return CountQwen(dir, std::move(qwen), lora);
}

}  // namespace

PlanModel CountFluxTransformer(const std::string& name,
                               const flux::FluxTransformerImpl& transformer) {
  PlanModel model;
  model.name = name;
  for (const auto& block : transformer.blocks()) {
    const bool single = block->as<flux::SingleStreamBlockImpl>() != nullptr;
    model.units.push_back(single ? CountBlock(*block, BlockKind::kSingleStream, kFluxSingle)
                                 : CountBlock(*block, BlockKind::kDualStream, kFluxDual));
  }
  CountReplicated(transformer, model);
  const flux::FluxTransformerConfig& config = transformer.config();
  model.dim = config.inner_dim();
  model.heads = config.num_attention_heads;
  model.text_dim = config.joint_attention_dim;
  model.pooled_dim = config.pooled_projection_dim;
  model.latent_channels = config.in_channels;
  model.default_text_tokens = 512;            // the Kontext pipeline's max_sequence_length for T5
  model.text_encoders = Placement::kSharded;  // as dray train's workers shard T5
  return model;
}

absl::StatusOr<PlanModel> LoadPlanModel(const std::string& model, const LoraPlan& lora) {
  if (lora.rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lora-rank must be >= 0 (0: full fine-tuning), got ", lora.rank));
  }
  if (absl::StartsWith(model, "flux-") && !std::filesystem::is_directory(model))
    return FluxPreset(model, lora);
  if (qwen_image::PresetNamed(model).ok() && !std::filesystem::is_directory(model))
    return QwenPreset(model, lora);
  if (!std::filesystem::is_directory(model)) {
    return absl::NotFoundError(absl::StrCat("--model '", model, "' is neither a preset (",
                                            kPlanPresets, ") nor a model directory"));
  }
  return ModelDirectory(model, lora);
}

}  // namespace dray
