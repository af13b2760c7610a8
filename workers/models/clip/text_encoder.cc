#include "workers/models/clip/text_encoder.h"

#include <ATen/ATen.h>

#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/shape_string.h"
#include "base/status_macros.h"
#include "workers/models/component_weights.h"

namespace dray::clip {
namespace {

// IgnoreBookkeeping accepts the keys of a CLIPTextConfig that change
// nothing in CLIPTextModel's forward: unused token ids and projection,
// dropout and initialization, and the generic keys every PretrainedConfig
// writes out (transformers 4 and 5).
void IgnoreBookkeeping(JsonConfig& json) {
  json.Ignore({"attention_dropout", "is_decoder", "bos_token_id", "dropout", "initializer_factor",
               "initializer_range", "pad_token_id", "projection_dim", "tie_word_embeddings"});
  json.IgnorePretrainedConfigKeys();
}

absl::Status Validate(const ClipTextConfig& c) {
  if (c.hidden_act != "quick_gelu" && c.hidden_act != "gelu") {
    return absl::UnimplementedError(
        absl::StrCat("hidden_act '", c.hidden_act, "' is not supported (quick_gelu or gelu)"));
  }
  if (c.num_attention_heads < 1 || c.hidden_size % c.num_attention_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("hidden_size ", c.hidden_size,
                                                   " must split into num_attention_heads ",
                                                   c.num_attention_heads));
  }
  return absl::OkStatus();
}

absl::Status CheckInputIds(const at::Tensor& ids, const ClipTextConfig& c) {
  if (ids.dim() != 2 || !at::isIntegralType(ids.scalar_type(), /*includeBool=*/false) ||
      ids.size(1) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CLIP text model: input_ids must be integers [B, S] with S >= 1, got ",
                     c10::toString(ids.scalar_type()), " ", ShapeString(ids.sizes())));
  }
  if (ids.size(1) > c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("CLIP text model: ", ids.size(1),
                                                   " tokens exceed max_position_embeddings ",
                                                   c.max_position_embeddings));
  }
  if (ids.numel() > 0 &&
      (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= c.vocab_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CLIP text model: token ids must lie in [0, ", c.vocab_size, ")"));
  }
  return absl::OkStatus();
}

Linear NewLinear(int64_t in, int64_t out, const at::TensorOptions& options) {
  return Linear(Linear::Impl::Options{in, out, /*bias=*/true, options});
}

}  // namespace

absl::StatusOr<ClipTextConfig> ClipTextConfig::FromJson(JsonConfig json) {
  std::string model_type = "clip_text_model";
  DRAY_RETURN_IF_ERROR(json.Get("model_type", &model_type));
  if (model_type != "clip_text_model") {
    return absl::UnimplementedError(
        absl::StrCat("model_type '", model_type, "' is not supported (clip_text_model only)"));
  }
  IgnoreBookkeeping(json);
  ClipTextConfig c;
  for (auto [key, value] : std::initializer_list<std::pair<const char*, int64_t*>>{
           {"vocab_size", &c.vocab_size},
           {"hidden_size", &c.hidden_size},
           {"intermediate_size", &c.intermediate_size},
           {"num_hidden_layers", &c.num_hidden_layers},
           {"num_attention_heads", &c.num_attention_heads},
           {"max_position_embeddings", &c.max_position_embeddings},
           {"eos_token_id", &c.eos_token_id}}) {
    DRAY_RETURN_IF_ERROR(json.Get(key, value));
  }
  DRAY_RETURN_IF_ERROR(json.Get("hidden_act", &c.hidden_act));
  DRAY_RETURN_IF_ERROR(json.Get("layer_norm_eps", &c.layer_norm_eps));
  DRAY_RETURN_IF_ERROR(json.Finish());
  DRAY_RETURN_IF_ERROR(Validate(c));
  return c;
}

absl::StatusOr<ClipTextConfig> ClipTextConfig::FromFile(const std::string& path) {
  return ReadConfigFile<ClipTextConfig>(path);
}

std::string ClipTextConfig::ToJson() const {
  const nlohmann::json json = {{"architectures", {"CLIPTextModel"}},
                               {"model_type", "clip_text_model"},
                               {"vocab_size", vocab_size},
                               {"hidden_size", hidden_size},
                               {"intermediate_size", intermediate_size},
                               {"num_hidden_layers", num_hidden_layers},
                               {"num_attention_heads", num_attention_heads},
                               {"max_position_embeddings", max_position_embeddings},
                               {"hidden_act", hidden_act},
                               {"layer_norm_eps", layer_norm_eps},
                               {"eos_token_id", eos_token_id},
                               {"torch_dtype", "float32"}};
  return json.dump(2);
}

ClipEncoderLayerImpl::ClipEncoderLayerImpl(const ClipTextConfig& config, at::TensorOptions options)
    : heads_(config.num_attention_heads), exact_gelu_(config.hidden_act == "gelu") {
  const int64_t dim = config.hidden_size;
  layer_norm1_ = RegisterAt(*this, "layer_norm1", LayerNorm(dim, config.layer_norm_eps, options));
  q_ = RegisterAt(*this, "self_attn.q_proj", NewLinear(dim, dim, options));
  k_ = RegisterAt(*this, "self_attn.k_proj", NewLinear(dim, dim, options));
  v_ = RegisterAt(*this, "self_attn.v_proj", NewLinear(dim, dim, options));
  out_ = RegisterAt(*this, "self_attn.out_proj", NewLinear(dim, dim, options));
  layer_norm2_ = RegisterAt(*this, "layer_norm2", LayerNorm(dim, config.layer_norm_eps, options));
  fc1_ = RegisterAt(*this, "mlp.fc1", NewLinear(dim, config.intermediate_size, options));
  fc2_ = RegisterAt(*this, "mlp.fc2", NewLinear(config.intermediate_size, dim, options));
}

at::Tensor ClipEncoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& allowed) {
  const at::Tensor h = layer_norm1_->forward(x);
  auto heads = [this](const at::Tensor& t) {
    return t.unflatten(-1, {heads_, -1}).transpose(1, 2);
  };  // [B, heads, S, head_dim]
  const at::Tensor attention = DotProductAttention(heads(q_->forward(h)), heads(k_->forward(h)),
                                                   heads(v_->forward(h)), allowed)
                                   .transpose(1, 2)
                                   .flatten(2);
  const at::Tensor y = x + out_->forward(attention);
  const at::Tensor hidden = fc1_->forward(layer_norm2_->forward(y));
  // quick_gelu is transformers' x * sigmoid(1.702 x).
  const at::Tensor activated =
      exact_gelu_ ? at::gelu(hidden) : hidden * at::sigmoid(hidden * 1.702);
  return y + fc2_->forward(activated);
}

ClipTextModelImpl::ClipTextModelImpl(ClipTextConfig config, at::TensorOptions options)
    : config_(std::move(config)) {
  const int64_t dim = config_.hidden_size;
  token_embedding_ = RegisterAt(*this, "text_model.embeddings.token_embedding",
                                Embedding(config_.vocab_size, dim, options));
  position_embedding_ = RegisterAt(*this, "text_model.embeddings.position_embedding",
                                   Embedding(config_.max_position_embeddings, dim, options));
  layers_ = RegisterAt(*this, "text_model.encoder.layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i)
    layers_->push_back(ClipEncoderLayer(config_, options));
  final_layer_norm_ = RegisterAt(*this, "text_model.final_layer_norm",
                                 LayerNorm(dim, config_.layer_norm_eps, options));
}

std::vector<std::shared_ptr<torch::nn::Module>> ClipTextModelImpl::blocks() const {
  return std::vector<std::shared_ptr<torch::nn::Module>>(layers_->begin(), layers_->end());
}

at::Tensor ClipTextModelImpl::PooledPositions(const at::Tensor& ids) const {
  // transformers takes argmax over int32 ids: the first of equal maxima.
  const at::Tensor ints = ids.to(at::kInt);
  if (config_.eos_token_id == 2) return ints.argmax(-1);
  return ints.eq(config_.eos_token_id).to(at::kInt).argmax(-1);
}

absl::StatusOr<ClipTextOutput> ClipTextModelImpl::forward(const at::Tensor& input_ids) {
  DRAY_RETURN_IF_ERROR(CheckInputIds(input_ids, config_));
  const int64_t length = input_ids.size(1);
  if (unit_hooks_ != nullptr) unit_hooks_->BeforeForward();
  const at::Device device = token_embedding_->weight.device();
  const at::Tensor ids = input_ids.to(device, at::kLong);
  at::Tensor x = token_embedding_->forward(ids) + position_embedding_->weight.narrow(0, 0, length);
  const at::Tensor causal =
      at::ones({length, length}, at::TensorOptions(at::kBool).device(device)).tril();
  for (size_t i = 0; i < layers_->size(); ++i) {
    if (unit_hooks_ != nullptr) unit_hooks_->BeforeUnit(i);
    x = layers_->ptr<ClipEncoderLayerImpl>(i)->forward(x, causal);
    if (unit_hooks_ != nullptr) unit_hooks_->AfterUnit(i, {x});
  }
  ClipTextOutput out;
  out.last_hidden_state = final_layer_norm_->forward(x);
  out.pooler_output =
      out.last_hidden_state.index({at::arange(ids.size(0), ids.options()), PooledPositions(ids)});
  return out;
}

absl::StatusOr<ClipTextModel> LoadClipTextModel(const std::string& dir, at::TensorOptions options,
                                                Weights weights) {
  DRAY_ASSIGN_OR_RETURN(ClipTextConfig config, ClipTextConfig::FromFile(dir + "/config.json"));
  if (weights == Weights::kShapeOnly) {
    DeferredAllocation deferred;
    return ClipTextModel(std::move(config), options);
  }
  DRAY_ASSIGN_OR_RETURN(Checkpoint checkpoint, OpenComponentWeights(dir));
  ClipTextModel model(std::move(config), options);
  const absl::Status loaded =
      LoadStateDict(*model, checkpoint, "", {"text_model.embeddings.position_ids"});
  if (!loaded.ok()) return absl::Status(loaded.code(), absl::StrCat(dir, ": ", loaded.message()));
  return model;
}

}  // namespace dray::clip
