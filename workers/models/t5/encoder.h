// T5EncoderModel (T5 v1.1), FLUX.1's second text encoder, as transformers
// defines it: token embeddings, then blocks of pre-norm self-attention and
// a gated-GELU feed-forward (wo(gelu_new(wi_0 x) * wi_1 x)), a final norm.
// Norms are T5LayerNorm (RMS, no mean, no bias); attention scores are not
// scaled by 1/sqrt(d) and get a learned relative position bias (bidirectional
// log-spaced buckets) that block 0 computes and every block reuses. No
// attention mask: FLUX passes none, padding included.
//
// Parameter names are transformers' (`encoder.block.N.layer.0.SelfAttention.q`,
// `shared`), so a diffusers `text_encoder_2/` directory loads as-is.
// transformers' own outputs in tests/data/reference/flux_kontext/text_encoders
// match (tests/models/flux_text_encoders_test.cc).
//
//   DRAY_ASSIGN_OR_RETURN(t5::T5Encoder t5,
//                         t5::LoadT5Encoder("text_encoder_2", at::TensorOptions(at::kFloat)));
//   DRAY_ASSIGN_OR_RETURN(at::Tensor hidden, t5->forward(ids));  // [B, S] -> [B, S, d_model]
//
// Thread-safety: not thread-safe.
#ifndef DRAY_WORKERS_MODELS_T5_ENCODER_H_
#define DRAY_WORKERS_MODELS_T5_ENCODER_H_

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

namespace dray::t5 {

// T5EncoderConfig: T5Config's config.json keys for a gated-GELU encoder
// (feed_forward_proj "gated-gelu", the only one supported). Defaults are
// transformers' (what a key absent from config.json means); FLUX.1's
// t5-v1_1-xxl has vocab_size 32128, d_model 4096, d_ff 10240, 24 layers
// and 64 heads.
struct T5EncoderConfig {
  int64_t vocab_size = 32128;
  int64_t d_model = 512;
  int64_t d_kv = 64;  // per head
  int64_t d_ff = 2048;
  int64_t num_layers = 6;
  int64_t num_heads = 8;
  int64_t relative_attention_num_buckets = 32;  // both directions together
  int64_t relative_attention_max_distance = 128;
  double layer_norm_epsilon = 1e-6;

  int64_t inner_dim() const { return num_heads * d_kv; }

  // FromJson reads a transformers T5Config (model_type "t5"); an unknown
  // key, another feed-forward or a decoder is an error.
  static absl::StatusOr<T5EncoderConfig> FromJson(JsonConfig json);
  static absl::StatusOr<T5EncoderConfig> FromFile(const std::string& path);
  // ToJson writes the config.json transformers reads this config from.
  std::string ToJson() const;
};

// T5BlockImpl: one encoder block (self-attention, then the feed-forward,
// each pre-norm and added to its input); a sharding unit. Block 0 holds the
// relative position bias table.
class T5BlockImpl : public torch::nn::Module {
 public:
  T5BlockImpl(const T5EncoderConfig& config, bool has_relative_attention_bias,
              at::TensorOptions options);
  // PositionBias returns the attention bias [1, heads, S, S] for `length`
  // tokens from this block's table (block 0's only).
  at::Tensor PositionBias(int64_t length);
  // x [B, S, d_model]; position_bias [1, heads, S, S].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& position_bias);

 private:
  at::Tensor Attention(const at::Tensor& x, const at::Tensor& position_bias);

  int64_t heads_, num_buckets_, max_distance_;
  RMSNorm attention_norm_{nullptr}, ff_norm_{nullptr};  // T5LayerNorm is this RMSNorm
  Linear q_{nullptr}, k_{nullptr}, v_{nullptr}, o_{nullptr};
  Embedding relative_attention_bias_{nullptr};  // block 0 only
  Linear wi_0_{nullptr}, wi_1_{nullptr}, wo_{nullptr};
};
TORCH_MODULE(T5Block);

class T5EncoderImpl : public torch::nn::Module {
 public:
  // Builds the encoder with uninitialized parameters of `options` (the meta
  // device gives shapes only; LoadStateDict fills them).
  T5EncoderImpl(T5EncoderConfig config, at::TensorOptions options = {});

  // forward returns the last hidden states [B, S, d_model] (after the final
  // norm) for `input_ids` [B, S] (integers in [0, vocab_size), S >= 1);
  // anything else is INVALID_ARGUMENT.
  absl::StatusOr<at::Tensor> forward(const at::Tensor& input_ids);

  const T5EncoderConfig& config() const { return config_; }
  // blocks: the encoder blocks, the sharding units, in the order forward
  // runs them.
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() const;
  // set_unit_hooks makes forward call `hooks` around each block (index in
  // blocks()); null: none. `hooks` must outlive every later forward.
  void set_unit_hooks(UnitHooks* hooks) { unit_hooks_ = hooks; }

 private:
  T5EncoderConfig config_;
  Embedding shared_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  RMSNorm final_layer_norm_{nullptr};
  UnitHooks* unit_hooks_ = nullptr;
};
TORCH_MODULE(T5Encoder);

// LoadT5Encoder builds the T5EncoderModel of `dir` (a transformers
// directory: config.json and safetensors) in `options` and loads its
// weights, or, with Weights::kShapeOnly, builds it shape-only (under
// DeferredAllocation) without reading them. The embedding table is
// `shared.weight`; a stored `encoder.embed_tokens.weight` is its tied copy
// and ignored, as transformers ties it.
absl::StatusOr<T5Encoder> LoadT5Encoder(const std::string& dir, at::TensorOptions options,
                                        Weights weights = Weights::kRead);

}  // namespace dray::t5

#endif  // DRAY_WORKERS_MODELS_T5_ENCODER_H_
