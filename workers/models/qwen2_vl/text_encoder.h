// Qwen2.5-VL as Qwen-Image-Edit's text encoder: the vision tower turns the
// input image into tokens, they replace the prompt's <|image_pad|> tokens,
// and the Qwen2 decoder (grouped-query attention with q/k/v bias, RMSNorm,
// SwiGLU, multimodal RoPE over text and image positions) returns its last
// hidden states. Nothing is generated; the LM head only serves parity
// checks (Logits).
//
// Parameter names are Hugging Face's (`model.layers.N.self_attn.q_proj`,
// `visual.blocks.N.attn.qkv`, `lm_head`), so a diffusers `text_encoder/`
// directory loads as-is; checkpoints saved by transformers >= 4.52
// (`model.language_model.*`, `model.visual.*`) load too. Every case of
// transformers' own outputs in tests/data/reference/qwen2_vl matches
// (workers/parity/qwen2_vl_parity.h).
//
//   DRAY_ASSIGN_OR_RETURN(Qwen25VLTextEncoder encoder,
//                         LoadTextEncoder("text_encoder", at::TensorOptions().dtype(at::kFloat)));
//   DRAY_ASSIGN_OR_RETURN(at::Tensor hidden, encoder->forward(ids, mask, pixels, grids));
//
// Thread-safety: not thread-safe.
#ifndef DRAY_WORKERS_MODELS_QWEN2_VL_TEXT_ENCODER_H_
#define DRAY_WORKERS_MODELS_QWEN2_VL_TEXT_ENCODER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "runtime/io/safetensors.h"
#include "runtime/sharding/unit_hooks.h"
#include "workers/models/json_config.h"
#include "workers/models/layers.h"

namespace dray::qwen2_vl {

// VisionConfig: the `vision_config` of config.json; defaults are Qwen2.5-VL-7B's.
struct VisionConfig {
  int64_t depth = 32;
  int64_t hidden_size = 1280;
  int64_t intermediate_size = 3420;
  int64_t num_heads = 16;
  int64_t in_chans = 3;
  int64_t out_hidden_size = 3584;  // the language model's width
  int64_t patch_size = 14;
  int64_t spatial_merge_size = 2;  // 2x2 patches become one token
  int64_t temporal_patch_size = 2;
  int64_t window_size = 112;  // pixels per side of an attention window
  std::vector<int64_t> fullatt_block_indexes = {7, 15, 23, 31};
  int64_t tokens_per_second = 2;  // video only

  int64_t head_dim() const { return hidden_size / num_heads; }
  // patch_dim: values per patch: channels x temporal x patch x patch.
  int64_t patch_dim() const { return in_chans * temporal_patch_size * patch_size * patch_size; }
};

// TextEncoderConfig: Qwen2_5_VLConfig's keys; defaults are Qwen2.5-VL-7B's
// (what Qwen-Image-Edit ships).
struct TextEncoderConfig {
  int64_t vocab_size = 152064;
  int64_t hidden_size = 3584;
  int64_t intermediate_size = 18944;
  int64_t num_hidden_layers = 28;
  int64_t num_attention_heads = 28;
  int64_t num_key_value_heads = 4;
  double rms_norm_eps = 1e-6;
  double rope_theta = 1000000;
  std::vector<int64_t> mrope_section = {16, 24, 24};  // rotary pairs for time, height, width
  bool tie_word_embeddings = false;
  int64_t image_token_id = 151655;
  int64_t video_token_id = 151656;
  int64_t vision_start_token_id = 151652;
  int64_t vision_end_token_id = 151653;
  int64_t vision_token_id = 151654;
  int64_t bos_token_id = 151643;
  int64_t eos_token_id = 151645;
  VisionConfig vision;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }

  // FromJson reads a transformers config.json (flat, or with `text_config`);
  // options dray does not implement (sliding window, other activations or
  // RoPE types) are errors.
  static absl::StatusOr<TextEncoderConfig> FromJson(JsonConfig json);
  static absl::StatusOr<TextEncoderConfig> FromFile(const std::string& path);
  std::string ToJson() const;
};

// ImageGrid: one image's patch grid (frames, height, width) in patches.
using ImageGrid = std::array<int64_t, 3>;

// MultimodalPositions returns Qwen2.5-VL's 3D position ids [3, B, S] for
// right- or left-padded `input_ids` [B, S] with `attention_mask`: text
// tokens count up on all three axes; an image's tokens take (0, row,
// column) from the text position before them, and text resumes after the
// image's largest index. Padding gets 1, as in transformers. The images
// appear in `grids` in prompt order; a count mismatch is INVALID_ARGUMENT.
absl::StatusOr<at::Tensor> MultimodalPositions(const at::Tensor& input_ids,
                                               const at::Tensor& attention_mask,
                                               const std::vector<ImageGrid>& grids,
                                               const TextEncoderConfig& config);

// VisionWindowLayout: how the vision tower's window attention regroups the
// merged tokens (2x2 patch groups) of a batch of images.
struct VisionWindowLayout {
  std::vector<int64_t> order;    // merged tokens window by window (transformers' window_index)
  std::vector<int64_t> lengths;  // each non-empty window's length in patches
};

// VisionWindows lays out `grids` (in order) in windows of window_size
// pixels, row-major within each frame of each image; windows at the right
// and bottom edges may be partial.
VisionWindowLayout VisionWindows(const std::vector<ImageGrid>& grids, const VisionConfig& config);

// VisionRotaryAngles returns each patch's rotary angles [N, head_dim / 2]
// (its row's angles, then its column's) in the image processor's patch
// order, before any window regrouping (transformers' rot_pos_emb).
at::Tensor VisionRotaryAngles(const std::vector<ImageGrid>& grids, const VisionConfig& config);

// GatedMlpImpl: down(silu(gate(x)) * up(x)) (gate_proj, up_proj, down_proj).
class GatedMlpImpl : public torch::nn::Module {
 public:
  GatedMlpImpl(int64_t dim, int64_t hidden, bool bias, at::TensorOptions options);
  at::Tensor forward(const at::Tensor& x);

 private:
  Linear gate_{nullptr}, up_{nullptr}, down_{nullptr};
};
TORCH_MODULE(GatedMlp);

// DecoderLayerImpl: one Qwen2 decoder layer; a sharding unit.
class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const TextEncoderConfig& config, at::TensorOptions options);
  // x [B, S, hidden]; cos, sin [B, S, head_dim]; allowed bool [B, 1, S, S].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& allowed);

 private:
  int64_t heads_, kv_heads_;
  RMSNorm input_norm_{nullptr}, post_attention_norm_{nullptr};
  Linear q_{nullptr}, k_{nullptr}, v_{nullptr}, o_{nullptr};
  GatedMlp mlp_{nullptr};
};
TORCH_MODULE(DecoderLayer);

// VisionBlockImpl: one vision transformer block; a sharding unit.
class VisionBlockImpl : public torch::nn::Module {
 public:
  VisionBlockImpl(const VisionConfig& config, at::TensorOptions options);
  // x [N, hidden]; cos, sin [N, head_dim]; tokens attend only within
  // consecutive segments of these lengths (windows, or whole images).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const std::vector<int64_t>& segments);

 private:
  int64_t heads_;
  RMSNorm norm1_{nullptr}, norm2_{nullptr};
  Linear qkv_{nullptr}, proj_{nullptr};
  GatedMlp mlp_{nullptr};
};
TORCH_MODULE(VisionBlock);

// Where a checkpoint keeps the language model and the vision tower.
enum class WeightLayout {
  kLegacy,         // model.layers.*, visual.*  (Qwen-Image-Edit's files)
  kLanguageModel,  // model.language_model.layers.*, model.visual.*  (transformers >= 4.52)
};

class Qwen25VLTextEncoderImpl : public torch::nn::Module {
 public:
  Qwen25VLTextEncoderImpl(TextEncoderConfig config, at::TensorOptions options = {},
                          WeightLayout layout = WeightLayout::kLegacy);

  // forward returns the last layer's hidden states (after the final norm)
  // [B, S, hidden] for `input_ids` [B, S] with `attention_mask` [B, S]
  // (1 = token, 0 = padding); each <|image_pad|> token takes the next image
  // token from `patches` / `grids` (empty when the prompts have no image).
  absl::StatusOr<at::Tensor> forward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                     const at::Tensor& patches,
                                     const std::vector<ImageGrid>& grids);

  // The parts of forward, for checking them one by one on an unsharded
  // encoder (no unit hooks run):
  // EmbedInputs returns the token embeddings [B, S, hidden] with the image
  // tokens in the <|image_pad|> slots (transformers' inputs_embeds).
  absl::StatusOr<at::Tensor> EmbedInputs(const at::Tensor& input_ids, const at::Tensor& patches,
                                         const std::vector<ImageGrid>& grids);
  // EncodeImages runs the vision tower: patches [N, patch_dim] in the image
  // processor's order, `grids` per image -> tokens [N / merge^2, hidden] in
  // the same order.
  absl::StatusOr<at::Tensor> EncodeImages(const at::Tensor& patches,
                                          const std::vector<ImageGrid>& grids);
  // Logits applies the LM head (the embedding table when tied) to hidden states.
  at::Tensor Logits(const at::Tensor& hidden);

  const TextEncoderConfig& config() const { return config_; }
  // blocks: the sharding units in the order they run: vision blocks, then
  // decoder layers. UnitHooks indices follow this order.
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() const;
  void set_unit_hooks(UnitHooks* hooks) { unit_hooks_ = hooks; }

 private:
  // RunUnit runs sharding unit `index` between its hooks.
  at::Tensor RunUnit(size_t index, const std::function<at::Tensor()>& run);

  TextEncoderConfig config_;
  Embedding embed_tokens_{nullptr};
  torch::nn::ModuleList layers_{nullptr};
  RMSNorm norm_{nullptr};
  Linear lm_head_{nullptr};
  at::Tensor patch_embed_;  // visual.patch_embed.proj.weight [hidden, C, T, P, P]
  torch::nn::ModuleList vision_blocks_{nullptr};
  RMSNorm merger_norm_{nullptr};
  Linear merger_fc1_{nullptr}, merger_fc2_{nullptr};
  UnitHooks* unit_hooks_ = nullptr;
};
TORCH_MODULE(Qwen25VLTextEncoder);

// LoadTextEncoder builds the text encoder of `dir` (a transformers
// directory: config.json and safetensors) in `options` and loads its
// weights, whichever WeightLayout they use (or, with Weights::kShapeOnly,
// builds it shape-only in the checkpoint's layout). With tied embeddings a
// stored `lm_head.weight` is ignored, as transformers ignores it.
absl::StatusOr<Qwen25VLTextEncoder> LoadTextEncoder(const std::string& dir,
                                                    at::TensorOptions options,
                                                    Weights weights = Weights::kRead);

}  // namespace dray::qwen2_vl

#endif  // DRAY_WORKERS_MODELS_QWEN2_VL_TEXT_ENCODER_H_
