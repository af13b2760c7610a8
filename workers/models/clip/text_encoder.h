// CLIPTextModel, FLUX.1's first text encoder, as transformers defines it:
// token plus learned position embeddings, pre-norm encoder layers with
// causal self-attention and a quick-GELU (or GELU) MLP, a final LayerNorm;
// the pooled output is the final hidden state at each prompt's end-of-text
// token. No attention mask: FLUX passes none.
//
// Parameter names are transformers' (`text_model.encoder.layers.N.self_attn.q_proj`),
// so a diffusers `text_encoder/` directory loads as-is. transformers' own
// outputs in tests/data/reference/flux_kontext/text_encoders match
// (tests/models/flux_text_encoders_test.cc).
//
//   DRAY_ASSIGN_OR_RETURN(clip::ClipTextModel clip,
//                         clip::LoadClipTextModel("text_encoder", at::TensorOptions(at::kFloat)));
//   DRAY_ASSIGN_OR_RETURN(clip::ClipTextOutput out, clip->forward(ids));  // ids [B, 77]
//   at::Tensor pooled = out.pooler_output;                                // [B, hidden]
//
// Thread-safety: not thread-safe.
#ifndef DRAY_WORKERS_MODELS_CLIP_TEXT_ENCODER_H_
#define DRAY_WORKERS_MODELS_CLIP_TEXT_ENCODER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "runtime/sharding/unit_hooks.h"
#include "workers/models/json_config.h"
#include "workers/models/layers.h"

namespace dray::clip {

// ClipTextConfig: CLIPTextConfig's config.json keys. Defaults are
// transformers' (what a key absent from config.json means); FLUX.1's
// CLIP ViT-L/14 has hidden_size 768, intermediate_size 3072, 12 heads and
// eos_token_id 2.
struct ClipTextConfig {
  int64_t vocab_size = 49408;
  int64_t hidden_size = 512;
  int64_t intermediate_size = 2048;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 8;
  int64_t max_position_embeddings = 77;
  std::string hidden_act = "quick_gelu";  // the MLP's: "quick_gelu" or "gelu"
  double layer_norm_eps = 1e-5;
  // The pooled token: with 2 (configs older than transformers PR #24773),
  // the position of each row's largest id; else its first eos_token_id.
  int64_t eos_token_id = 49407;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }

  // FromJson reads a transformers CLIPTextConfig (model_type
  // "clip_text_model"); an unknown key or an unsupported activation is an
  // error.
  static absl::StatusOr<ClipTextConfig> FromJson(JsonConfig json);
  static absl::StatusOr<ClipTextConfig> FromFile(const std::string& path);
  // ToJson writes the config.json transformers reads this config from.
  std::string ToJson() const;
};

// ClipEncoderLayerImpl: one pre-norm encoder layer (causal self-attention,
// then the MLP, each added to its input); a sharding unit.
class ClipEncoderLayerImpl : public torch::nn::Module {
 public:
  ClipEncoderLayerImpl(const ClipTextConfig& config, at::TensorOptions options);
  // x [B, S, hidden]; allowed bool [S, S]: the keys each query may attend to.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& allowed);

 private:
  int64_t heads_;
  bool exact_gelu_;  // hidden_act "gelu"; else quick_gelu
  LayerNorm layer_norm1_{nullptr}, layer_norm2_{nullptr};
  Linear q_{nullptr}, k_{nullptr}, v_{nullptr}, out_{nullptr};
  Linear fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(ClipEncoderLayer);

// ClipTextOutput: what CLIPTextModel returns.
struct ClipTextOutput {
  at::Tensor last_hidden_state;  // [B, S, hidden], after the final LayerNorm
  at::Tensor pooler_output;      // [B, hidden]: last_hidden_state at each row's eos token
};

class ClipTextModelImpl : public torch::nn::Module {
 public:
  // Builds the model with uninitialized parameters of `options` (the meta
  // device gives shapes only; LoadStateDict fills them).
  ClipTextModelImpl(ClipTextConfig config, at::TensorOptions options = {});

  // forward encodes `input_ids` [B, S] (integers in [0, vocab_size), 1 <= S
  // <= max_position_embeddings); anything else is INVALID_ARGUMENT.
  absl::StatusOr<ClipTextOutput> forward(const at::Tensor& input_ids);

  const ClipTextConfig& config() const { return config_; }
  // blocks: the encoder layers, the sharding units, in the order forward
  // runs them.
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() const;
  // set_unit_hooks makes forward call `hooks` around each block (index in
  // blocks()); null: none. `hooks` must outlive every later forward.
  void set_unit_hooks(UnitHooks* hooks) { unit_hooks_ = hooks; }

 private:
  // PooledPositions returns each row's pooled position [B] for `ids` [B, S].
  at::Tensor PooledPositions(const at::Tensor& ids) const;

  ClipTextConfig config_;
  Embedding token_embedding_{nullptr}, position_embedding_{nullptr};
  torch::nn::ModuleList layers_{nullptr};
  LayerNorm final_layer_norm_{nullptr};
  UnitHooks* unit_hooks_ = nullptr;
};
TORCH_MODULE(ClipTextModel);

// LoadClipTextModel builds the CLIPTextModel of `dir` (a transformers
// directory: config.json and safetensors) in `options` and loads its
// weights, or, with Weights::kShapeOnly, builds it shape-only (under
// DeferredAllocation) without reading them. A stored
// `text_model.embeddings.position_ids` (older transformers) is ignored.
absl::StatusOr<ClipTextModel> LoadClipTextModel(const std::string& dir, at::TensorOptions options,
                                                Weights weights = Weights::kRead);

}  // namespace dray::clip

#endif  // DRAY_WORKERS_MODELS_CLIP_TEXT_ENCODER_H_
