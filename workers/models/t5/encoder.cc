#include "workers/models/t5/encoder.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/shape_string.h"
#include "base/status_macros.h"
#include "workers/models/component_weights.h"

namespace dray::t5 {
namespace {

// IgnoreBookkeeping accepts the keys of a T5Config that change nothing in
// T5EncoderModel's forward: the decoder's, token ids, dropout and
// initialization, and the generic keys every PretrainedConfig writes out
// (transformers 4 and 5) but is_decoder, which would make it a decoder.
void IgnoreBookkeeping(JsonConfig& json) {
  json.Ignore({"bos_token_id", "classifier_dropout", "dropout_rate", "eos_token_id",
               "gradient_checkpointing", "initializer_factor", "n_positions", "num_decoder_layers",
               "output_past", "pad_token_id", "scale_decoder_outputs", "tie_word_embeddings",
               "use_cache"});
  json.IgnorePretrainedConfigKeys();
}

// RequireGatedGelu reads the feed-forward keys: T5Config derives
// dense_act_fn and is_gated_act from feed_forward_proj (default "relu";
// "gated-gelu" means gelu_new), and a config.json may state them too.
absl::Status RequireGatedGelu(JsonConfig& json) {
  std::string proj = "relu";
  DRAY_RETURN_IF_ERROR(json.Get("feed_forward_proj", &proj));
  bool gated = absl::StartsWith(proj, "gated-");
  std::string act = proj == "gated-gelu" ? "gelu_new" : proj.substr(proj.rfind('-') + 1);
  DRAY_RETURN_IF_ERROR(json.Get("is_gated_act", &gated));
  DRAY_RETURN_IF_ERROR(json.Get("dense_act_fn", &act));
  if (gated && act == "gelu_new") return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat("feed_forward_proj '", proj, "' (dense_act_fn '",
                                               act, "', is_gated_act ", gated,
                                               ") is not supported (T5 v1.1's gated-gelu only)"));
}

absl::Status CheckInputIds(const at::Tensor& ids, const T5EncoderConfig& c) {
  if (ids.dim() != 2 || !at::isIntegralType(ids.scalar_type(), /*includeBool=*/false) ||
      ids.size(1) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("T5 encoder: input_ids must be integers [B, S] with S >= 1, got ",
                     c10::toString(ids.scalar_type()), " ", ShapeString(ids.sizes())));
  }
  if (ids.numel() > 0 &&
      (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= c.vocab_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("T5 encoder: token ids must lie in [0, ", c.vocab_size, ")"));
  }
  return absl::OkStatus();
}

// RelativePositionBuckets: transformers' _relative_position_bucket
// (bidirectional) for every (query, key) pair of `length` tokens, [S, S]:
// keys after the query take the upper half of the buckets; within a half,
// distances below half / 2 get a bucket each and longer ones log-spaced
// buckets up to max_distance, computed as there (float32 log, truncated).
at::Tensor RelativePositionBuckets(int64_t length, int64_t num_buckets, int64_t max_distance,
                                   at::Device device) {
  const at::Tensor positions = at::arange(length, at::TensorOptions(at::kLong).device(device));
  const at::Tensor relative = positions.unsqueeze(0) - positions.unsqueeze(1);  // key - query
  const at::Tensor distance = relative.abs();
  const int64_t half = num_buckets / 2, max_exact = half / 2;
  at::Tensor large = (at::log(distance.to(at::kFloat) / max_exact) /
                      std::log(static_cast<double>(max_distance) / max_exact) * (half - max_exact))
                         .to(at::kLong) +
                     max_exact;
  large = at::minimum(large, at::full_like(large, half - 1));
  return relative.gt(0).to(at::kLong) * half + at::where(distance.lt(max_exact), distance, large);
}

// GeluNew: transformers' NewGELUActivation, op for op:
// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
at::Tensor GeluNew(const at::Tensor& x) {
  return x * 0.5 * (at::tanh((x + x.pow(3.0) * 0.044715) * std::sqrt(2.0 / M_PI)) + 1.0);
}

// ClampFloat16: T5Block's guard for float16 after each sublayer: values
// clamped to the largest finite one (1000 less where any is infinite).
at::Tensor ClampFloat16(const at::Tensor& x) {
  if (x.scalar_type() != at::kHalf) return x;
  const double max = std::numeric_limits<c10::Half>::max();
  const at::Tensor bound = at::where(x.isinf().any(), max - 1000, max);
  return x.clamp(-bound, bound);
}

Linear NewLinear(int64_t in, int64_t out, const at::TensorOptions& options) {
  return Linear(Linear::Impl::Options{in, out, /*bias=*/false, options});
}

// Validate: sizes a T5 encoder can be built and run with (the relative
// position buckets split into exact and logarithmic halves per direction).
absl::Status Validate(const T5EncoderConfig& c) {
  for (auto [key, value] :
       std::initializer_list<std::pair<const char*, int64_t>>{{"vocab_size", c.vocab_size},
                                                              {"d_model", c.d_model},
                                                              {"d_kv", c.d_kv},
                                                              {"d_ff", c.d_ff},
                                                              {"num_layers", c.num_layers},
                                                              {"num_heads", c.num_heads}}) {
    if (value < 1) return absl::InvalidArgumentError(absl::StrCat(key, " must be at least 1"));
  }
  if (c.relative_attention_num_buckets < 4 ||
      c.relative_attention_max_distance <= c.relative_attention_num_buckets / 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("relative_attention_num_buckets ", c.relative_attention_num_buckets,
                     " must be at least 4 and relative_attention_max_distance ",
                     c.relative_attention_max_distance, " more than a quarter of it"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<T5EncoderConfig> T5EncoderConfig::FromJson(JsonConfig json) {
  std::string model_type = "t5";
  DRAY_RETURN_IF_ERROR(json.Get("model_type", &model_type));
  if (model_type != "t5") {
    return absl::UnimplementedError(
        absl::StrCat("model_type '", model_type, "' is not supported (t5 only)"));
  }
  IgnoreBookkeeping(json);
  DRAY_RETURN_IF_ERROR(json.Unsupported("is_decoder"));
  DRAY_RETURN_IF_ERROR(RequireGatedGelu(json));
  T5EncoderConfig c;
  for (auto [key, value] : std::initializer_list<std::pair<const char*, int64_t*>>{
           {"vocab_size", &c.vocab_size},
           {"d_model", &c.d_model},
           {"d_kv", &c.d_kv},
           {"d_ff", &c.d_ff},
           {"num_layers", &c.num_layers},
           {"num_heads", &c.num_heads},
           {"relative_attention_num_buckets", &c.relative_attention_num_buckets},
           {"relative_attention_max_distance", &c.relative_attention_max_distance}}) {
    DRAY_RETURN_IF_ERROR(json.Get(key, value));
  }
  DRAY_RETURN_IF_ERROR(json.Get("layer_norm_epsilon", &c.layer_norm_epsilon));
  DRAY_RETURN_IF_ERROR(json.Finish());
  DRAY_RETURN_IF_ERROR(Validate(c));
  return c;
}

absl::StatusOr<T5EncoderConfig> T5EncoderConfig::FromFile(const std::string& path) {
  return ReadConfigFile<T5EncoderConfig>(path);
}

std::string T5EncoderConfig::ToJson() const {
  const nlohmann::json json = {{"architectures", {"T5EncoderModel"}},
                               {"model_type", "t5"},
                               {"feed_forward_proj", "gated-gelu"},
                               {"vocab_size", vocab_size},
                               {"d_model", d_model},
                               {"d_kv", d_kv},
                               {"d_ff", d_ff},
                               {"num_layers", num_layers},
                               {"num_heads", num_heads},
                               {"relative_attention_num_buckets", relative_attention_num_buckets},
                               {"relative_attention_max_distance", relative_attention_max_distance},
                               {"layer_norm_epsilon", layer_norm_epsilon},
                               {"torch_dtype", "float32"}};
  return json.dump(2);
}

T5BlockImpl::T5BlockImpl(const T5EncoderConfig& config, bool has_relative_attention_bias,
                         at::TensorOptions options)
    : heads_(config.num_heads),
      num_buckets_(config.relative_attention_num_buckets),
      max_distance_(config.relative_attention_max_distance) {
  const int64_t dim = config.d_model, inner = config.inner_dim();
  q_ = RegisterAt(*this, "layer.0.SelfAttention.q", NewLinear(dim, inner, options));
  k_ = RegisterAt(*this, "layer.0.SelfAttention.k", NewLinear(dim, inner, options));
  v_ = RegisterAt(*this, "layer.0.SelfAttention.v", NewLinear(dim, inner, options));
  o_ = RegisterAt(*this, "layer.0.SelfAttention.o", NewLinear(inner, dim, options));
  if (has_relative_attention_bias) {
    relative_attention_bias_ = RegisterAt(*this, "layer.0.SelfAttention.relative_attention_bias",
                                          Embedding(num_buckets_, heads_, options));
  }
  attention_norm_ =
      RegisterAt(*this, "layer.0.layer_norm", RMSNorm(dim, config.layer_norm_epsilon, options));
  wi_0_ = RegisterAt(*this, "layer.1.DenseReluDense.wi_0", NewLinear(dim, config.d_ff, options));
  wi_1_ = RegisterAt(*this, "layer.1.DenseReluDense.wi_1", NewLinear(dim, config.d_ff, options));
  wo_ = RegisterAt(*this, "layer.1.DenseReluDense.wo", NewLinear(config.d_ff, dim, options));
  ff_norm_ =
      RegisterAt(*this, "layer.1.layer_norm", RMSNorm(dim, config.layer_norm_epsilon, options));
}

at::Tensor T5BlockImpl::PositionBias(int64_t length) {
  TORCH_CHECK(!relative_attention_bias_.is_empty(), "only block 0 holds the position bias table");
  const at::Tensor buckets = RelativePositionBuckets(length, num_buckets_, max_distance_,
                                                     relative_attention_bias_->weight.device());
  return relative_attention_bias_->forward(buckets).permute({2, 0, 1}).unsqueeze(0);
}

at::Tensor T5BlockImpl::Attention(const at::Tensor& x, const at::Tensor& position_bias) {
  auto heads = [this](const at::Tensor& t) {
    return t.unflatten(-1, {heads_, -1}).transpose(1, 2);
  };  // [B, heads, S, d_kv]
  // transformers' eager attention: no 1/sqrt(d) scale, softmax in float32.
  at::Tensor scores = at::matmul(heads(q_->forward(x)), heads(k_->forward(x)).transpose(3, 2));
  scores += position_bias;
  const at::Tensor weights = at::softmax(AtLeastFloat32(scores), -1).to(scores.scalar_type());
  return o_->forward(at::matmul(weights, heads(v_->forward(x))).transpose(1, 2).flatten(2));
}

at::Tensor T5BlockImpl::forward(const at::Tensor& x, const at::Tensor& position_bias) {
  const at::Tensor y = ClampFloat16(x + Attention(attention_norm_->forward(x), position_bias));
  const at::Tensor h = ff_norm_->forward(y);
  return ClampFloat16(y + wo_->forward(GeluNew(wi_0_->forward(h)) * wi_1_->forward(h)));
}

T5EncoderImpl::T5EncoderImpl(T5EncoderConfig config, at::TensorOptions options)
    : config_(std::move(config)) {
  shared_ = RegisterAt(*this, "shared", Embedding(config_.vocab_size, config_.d_model, options));
  blocks_ = RegisterAt(*this, "encoder.block", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.num_layers; ++i)
    blocks_->push_back(T5Block(config_, /*has_relative_attention_bias=*/i == 0, options));
  final_layer_norm_ = RegisterAt(*this, "encoder.final_layer_norm",
                                 RMSNorm(config_.d_model, config_.layer_norm_epsilon, options));
}

std::vector<std::shared_ptr<torch::nn::Module>> T5EncoderImpl::blocks() const {
  return std::vector<std::shared_ptr<torch::nn::Module>>(blocks_->begin(), blocks_->end());
}

absl::StatusOr<at::Tensor> T5EncoderImpl::forward(const at::Tensor& input_ids) {
  DRAY_RETURN_IF_ERROR(CheckInputIds(input_ids, config_));
  if (unit_hooks_ != nullptr) unit_hooks_->BeforeForward();
  const at::Tensor ids = input_ids.to(shared_->weight.device(), at::kLong);
  at::Tensor x = shared_->forward(ids);
  at::Tensor position_bias;  // block 0's, reused by every block
  for (size_t i = 0; i < blocks_->size(); ++i) {
    if (unit_hooks_ != nullptr) unit_hooks_->BeforeUnit(i);
    auto block = blocks_->ptr<T5BlockImpl>(i);
    if (i == 0) position_bias = block->PositionBias(ids.size(1));
    x = block->forward(x, position_bias);
    if (unit_hooks_ == nullptr) continue;
    unit_hooks_->AfterUnit(
        i, i == 0 ? std::vector<at::Tensor>{x, position_bias} : std::vector<at::Tensor>{x});
  }
  return final_layer_norm_->forward(x);
}

absl::StatusOr<T5Encoder> LoadT5Encoder(const std::string& dir, at::TensorOptions options,
                                        Weights weights) {
  DRAY_ASSIGN_OR_RETURN(T5EncoderConfig config, T5EncoderConfig::FromFile(dir + "/config.json"));
  if (weights == Weights::kShapeOnly) {
    DeferredAllocation deferred;
    return T5Encoder(std::move(config), options);
  }
  DRAY_ASSIGN_OR_RETURN(Checkpoint checkpoint, OpenComponentWeights(dir));
  T5Encoder encoder(std::move(config), options);
  const absl::Status loaded =
      LoadStateDict(*encoder, checkpoint, "", {"encoder.embed_tokens.weight"});
  if (!loaded.ok()) return absl::Status(loaded.code(), absl::StrCat(dir, ": ", loaded.message()));
  return encoder;
}

}  // namespace dray::t5
