#include "workers/models/qwen_image/model.h"

#include <ATen/ops/empty.h>

#include <filesystem>
#include <optional>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "runtime/io/safetensors.h"
#include "workers/models/component_weights.h"
#include "workers/models/layers.h"
#include "workers/models/model_index.h"
#include "workers/models/qwen_image/prompt_template.h"

namespace dray::qwen_image {
namespace {

namespace fs = std::filesystem;

// kComponents: what a Qwen-Image-Edit model_index.json names.
const ModelComponent kComponents[] = {
    {"scheduler", {{"diffusers", "FlowMatchEulerDiscreteScheduler"}}},
    {"transformer", {{"diffusers", "QwenImageTransformer2DModel"}}},
    {"vae", {{"diffusers", "AutoencoderKLQwenImage"}}},
    {"text_encoder", {{"transformers", "Qwen2_5_VLForConditionalGeneration"}}},
    {"tokenizer", {{"transformers", "Qwen2Tokenizer"}}},
    {"processor", {{"transformers", "Qwen2VLProcessor"}}},
};

}  // namespace

absl::StatusOr<EditPipelineKind> ReadEditPipelineKind(const std::string& dir) {
  DRAY_ASSIGN_OR_RETURN(ModelIndex index, ReadModelIndex(dir));
  DRAY_RETURN_IF_ERROR(index.CheckComponents(kComponents));
  const std::string pipeline = index.pipeline();
  if (pipeline == kQwenImageEditPipeline) return EditPipelineKind::kEdit;
  if (pipeline == kQwenImageEditPlusPipeline) return EditPipelineKind::kEditPlus;
  return absl::InvalidArgumentError(
      absl::StrCat(index.path, ": _class_name must be ", kQwenImageEditPipeline, " or ",
                   kQwenImageEditPlusPipeline, ", found \"", pipeline, "\""));
}

namespace {

// kSpecialTokens: Qwen2's added tokens, in id order.
constexpr const char* kSpecialTokens[] = {
    "<|endoftext|>",      "<|im_start|>",     "<|im_end|>",     "<|object_ref_start|>",
    "<|object_ref_end|>", "<|box_start|>",    "<|box_end|>",    "<|quad_start|>",
    "<|quad_end|>",       "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>",      "<|video_pad|>"};

// kInstructionSamples: with the edit template, what the written tokenizer
// learns its merges from.
constexpr char kInstructionSamples[] =
    " Make the sky blue. Turn the cat into a dog. Add a red hat. Remove the background. Change the "
    "color of "
    "the car to green. Make it look like a painting.";

// WriteTokenizer writes a learned byte-level tokenizer with Qwen2's special
// tokens into the model directory `dir` and points the text encoder's
// vocabulary and token ids at it.
absl::Status WriteTokenizer(const fs::path& dir, int merges,
                            qwen2_vl::TextEncoderConfig& text_encoder) {
  BpeTokenizer::Model model = LearnBpeMerges(FormatEditPrompt(kInstructionSamples), merges);
  int64_t id = static_cast<int64_t>(model.vocab.size());
  for (const char* token : kSpecialTokens) model.added_tokens.push_back({id++, token, true});
  DRAY_ASSIGN_OR_RETURN(BpeTokenizer tokenizer, BpeTokenizer::Build(std::move(model)));
  text_encoder.vocab_size = tokenizer.vocab_size();
  for (auto [token, field] : std::initializer_list<std::pair<const char*, int64_t*>>{
           {"<|endoftext|>", &text_encoder.bos_token_id},
           {"<|im_end|>", &text_encoder.eos_token_id},
           {"<|image_pad|>", &text_encoder.image_token_id},
           {"<|video_pad|>", &text_encoder.video_token_id},
           {"<|vision_start|>", &text_encoder.vision_start_token_id},
           {"<|vision_end|>", &text_encoder.vision_end_token_id},
           {"<|vision_pad|>", &text_encoder.vision_token_id}}) {
    DRAY_ASSIGN_OR_RETURN(*field, tokenizer.TokenId(token));
  }
  // transformers' Qwen2VLProcessor loads its tokenizer from its own folder.
  for (const char* folder : {"tokenizer", "processor"})
    DRAY_RETURN_IF_ERROR(WriteQwen2TokenizerFiles((dir / folder).string(), tokenizer));
  return absl::OkStatus();
}

// ReducedTextEncoder: Qwen2.5-VL's layout at a small width: two decoder
// layers and two vision blocks (the second with full attention), MLPs twice
// as wide as their blocks.
qwen2_vl::TextEncoderConfig ReducedTextEncoder(int64_t hidden, int64_t heads, int64_t kv_heads,
                                               std::vector<int64_t> mrope_section,
                                               int64_t vision_hidden, int64_t window_size) {
  qwen2_vl::TextEncoderConfig text;
  text.num_hidden_layers = 2;
  text.hidden_size = text.vision.out_hidden_size = hidden;
  text.intermediate_size = 2 * hidden;
  text.num_attention_heads = heads;
  text.num_key_value_heads = kv_heads;
  text.mrope_section = std::move(mrope_section);
  text.vision.depth = 2;
  text.vision.fullatt_block_indexes = {1};
  text.vision.hidden_size = vision_hidden;
  text.vision.intermediate_size = 2 * vision_hidden;
  text.vision.num_heads = 2;
  text.vision.window_size = window_size;
  return text;
}

}  // namespace

absl::StatusOr<QwenImageModel> LoadQwenImageModel(const std::string& dir, at::TensorOptions options,
                                                  Weights weights) {
  const fs::path root(dir);
  QwenImageModel model;
  DRAY_ASSIGN_OR_RETURN(model.pipeline, ReadEditPipelineKind(dir));
  DRAY_ASSIGN_OR_RETURN(
      model.scheduler,
      FlowMatchEulerConfig::FromFile((root / "scheduler" / "scheduler_config.json").string()));
  DRAY_ASSIGN_OR_RETURN(
      TransformerConfig transformer,
      TransformerConfig::FromFile((root / "transformer" / "config.json").string()));
  DRAY_ASSIGN_OR_RETURN(VaeConfig vae,
                        VaeConfig::FromFile((root / "vae" / "config.json").string()));
  if (transformer.out_channels != vae.z_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": the transformer predicts ", transformer.out_channels,
                     " latent channels, the VAE has z_dim ", vae.z_dim));
  }
  {
    std::optional<DeferredAllocation> deferred;
    if (weights == Weights::kShapeOnly) deferred.emplace();
    model.transformer = QwenImageTransformer(transformer, options);
    model.vae = AutoencoderKLQwenImage(vae, options);
  }
  if (weights == Weights::kRead) {
    DRAY_ASSIGN_OR_RETURN(Checkpoint transformer_weights,
                          OpenComponentWeights((root / "transformer").string()));
    DRAY_RETURN_IF_ERROR(LoadStateDict(*model.transformer, transformer_weights));
    DRAY_ASSIGN_OR_RETURN(Checkpoint vae_weights, OpenComponentWeights((root / "vae").string()));
    DRAY_RETURN_IF_ERROR(LoadStateDict(*model.vae, vae_weights));
  }
  DRAY_ASSIGN_OR_RETURN(
      model.text_encoder,
      qwen2_vl::LoadTextEncoder((root / "text_encoder").string(), options, weights));
  if (model.text_encoder->config().hidden_size != transformer.joint_attention_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": the text encoder's hidden_size ", model.text_encoder->config().hidden_size,
        " differs from the transformer's joint_attention_dim ", transformer.joint_attention_dim));
  }
  DRAY_ASSIGN_OR_RETURN(BpeTokenizer tokenizer,
                        BpeTokenizer::FromDirectory((root / "tokenizer").string()));
  model.tokenizer = std::make_shared<const BpeTokenizer>(std::move(tokenizer));
  DRAY_ASSIGN_OR_RETURN(model.image_processor,
                        qwen2_vl::ImageProcessorConfig::FromFile(
                            (root / "processor" / "preprocessor_config.json").string()));
  return model;
}

absl::StatusOr<ModelPreset> PresetNamed(const std::string& name) {
  ModelPreset preset;
  preset.scheduler = FlowMatchEulerConfig::QwenImage();
  if (name == "real") return preset;
  if (name == "tiny") {
    preset.tokenizer_merges = 200;
    preset.text_encoder = ReducedTextEncoder(/*hidden=*/16, /*heads=*/2, /*kv_heads=*/1, {2, 1, 1},
                                             /*vision_hidden=*/16, /*window_size=*/56);
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
  if (name == "embedded") {
    // tiny's VAE and text encoder under a transformer wide and deep enough
    // to learn to copy the condition image while it edits it; Edit-Plus, so
    // that it takes several pictures.
    ModelPreset embedded = PresetNamed("tiny").value();
    embedded.pipeline = EditPipelineKind::kEditPlus;
    embedded.transformer = {2, 16, 4, 4, 32, 4, 16, {8, 12, 12}, false};
    return embedded;
  }
  if (name == "small") {
    preset.tokenizer_merges = 400;
    preset.text_encoder = ReducedTextEncoder(/*hidden=*/48, /*heads=*/4, /*kv_heads=*/2, {2, 2, 2},
                                             /*vision_hidden=*/32, /*window_size=*/112);
    preset.transformer = {2, 64, 16, 3, 32, 4, 48, {8, 12, 12}, false};
    preset.vae.base_dim = 12;
    return preset;
  }
  return absl::NotFoundError(
      absl::StrCat("unknown model preset '", name, "'; presets: tiny, embedded, small, real"));
}

absl::Status WriteQwen2TokenizerFiles(const std::string& dir, const BpeTokenizer& tokenizer) {
  const fs::path root(dir);
  std::error_code error;
  fs::create_directories(root, error);
  nlohmann::json decoder = nlohmann::json::object();
  for (const AddedToken& token : tokenizer.model().added_tokens) {
    decoder[std::to_string(token.id)] = {{"content", token.content}, {"lstrip", false},
                                         {"normalized", false},      {"rstrip", false},
                                         {"single_word", false},     {"special", token.special}};
  }
  const nlohmann::json config = {{"added_tokens_decoder", decoder},
                                 {"additional_special_tokens", nullptr},
                                 {"bos_token", nullptr},
                                 {"clean_up_tokenization_spaces", false},
                                 {"eos_token", "<|im_end|>"},
                                 {"errors", "replace"},
                                 {"model_max_length", 131072},
                                 {"pad_token", "<|endoftext|>"},
                                 {"split_special_tokens", false},
                                 {"tokenizer_class", "Qwen2Tokenizer"},
                                 {"unk_token", nullptr}};
  for (const auto& [file, text] : std::initializer_list<std::pair<const char*, std::string>>{
           {"tokenizer.json", tokenizer.ToJson()},
           {"vocab.json", tokenizer.VocabJson()},
           {"merges.txt", tokenizer.MergesTxt()},
           {"added_tokens.json", tokenizer.AddedTokensJson()},
           {"tokenizer_config.json", config.dump(2)}}) {
    DRAY_RETURN_IF_ERROR(WriteFile((root / file).string(), text));
  }
  return absl::OkStatus();
}

absl::StatusOr<qwen2_vl::TextEncoderConfig> WriteQwenImageModelConfigs(const std::string& dir,
                                                                       const ModelPreset& preset) {
  const fs::path root(dir);
  const char* pipeline = preset.pipeline == EditPipelineKind::kEditPlus ? kQwenImageEditPlusPipeline
                                                                        : kQwenImageEditPipeline;
  DRAY_RETURN_IF_ERROR(WriteModelIndex(dir, NewModelIndex(pipeline, kComponents), kComponents));
  qwen2_vl::TextEncoderConfig text_encoder = preset.text_encoder;
  DRAY_RETURN_IF_ERROR(WriteTokenizer(root, preset.tokenizer_merges, text_encoder));
  for (const auto& [file, json] : std::initializer_list<std::pair<const char*, std::string>>{
           {"scheduler/scheduler_config.json", preset.scheduler.ToJson()},
           {"transformer/config.json", preset.transformer.ToJson()},
           {"vae/config.json", preset.vae.ToJson()},
           {"text_encoder/config.json", text_encoder.ToJson()},
           {"processor/preprocessor_config.json", preset.image_processor.ToJson()}}) {
    DRAY_RETURN_IF_ERROR(WriteComponentConfig((root / file).string(), json));
  }
  return text_encoder;
}

absl::Status WriteRandomQwenImageModel(const std::string& dir, const ModelPreset& preset,
                                       uint64_t seed) {
  const fs::path root(dir);
  DRAY_ASSIGN_OR_RETURN(qwen2_vl::TextEncoderConfig text_encoder,
                        WriteQwenImageModelConfigs(dir, preset));
  const at::TensorOptions float32 = at::TensorOptions().dtype(at::kFloat);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  QwenImageTransformer transformer(preset.transformer, float32);
  InitializeLikePyTorch(*transformer, generator);
  DRAY_RETURN_IF_ERROR(WriteComponentWeights(
      (root / "transformer" / "diffusion_pytorch_model.safetensors").string(), *transformer));
  AutoencoderKLQwenImage vae(preset.vae, float32);
  InitializeLikePyTorch(*vae, generator);
  DRAY_RETURN_IF_ERROR(
      WriteComponentWeights((root / "vae" / "diffusion_pytorch_model.safetensors").string(), *vae));
  qwen2_vl::Qwen25VLTextEncoder encoder(text_encoder, float32);
  InitializeLikePyTorch(*encoder, generator);
  return WriteComponentWeights((root / "text_encoder" / "model.safetensors").string(), *encoder);
}

}  // namespace dray::qwen_image
