#include "workers/models/flux/transformer.h"

#include <ATen/ATen.h>

#include <cmath>
#include <numeric>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/shape_string.h"
#include "base/status_macros.h"
#include "runtime/sharding/activation_checkpoint.h"

namespace dray::flux {

std::vector<std::string> DiffusersLoraTargets() {
  return {"attn.to_k",
          "attn.to_q",
          "attn.to_v",
          "attn.to_out.0",
          "attn.add_k_proj",
          "attn.add_q_proj",
          "attn.add_v_proj",
          "attn.to_add_out",
          "ff.net.0.proj",
          "ff.net.2",
          "ff_context.net.0.proj",
          "ff_context.net.2"};
}
namespace {

// kTimestepChannels: width of the sinusoidal timestep and guidance embeddings.
constexpr int64_t kTimestepChannels = 256;
constexpr double kEps = 1e-6;

LinearImpl::Options LinearOptions(int64_t in, int64_t out, at::TensorOptions options) {
  return {in, out, /*bias=*/true, options};
}

at::Tensor LayerNorm(const at::Tensor& x) {
  return at::layer_norm(x, {x.size(-1)}, /*weight=*/{}, /*bias=*/{}, kEps);
}

// Modulate: x * (1 + scale) + shift for per-sample [B, D] parameters.
at::Tensor Modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
}

// Sinusoid: diffusers' Timesteps(256, flip_sin_to_cos=True,
// downscale_freq_shift=0) of `values` (already x1000): [cos, sin], float32.
at::Tensor Sinusoid(const at::Tensor& values) {
  const int64_t half = kTimestepChannels / 2;
  const at::Tensor exponent =
      at::arange(0, half, values.options().dtype(at::kFloat)) * -std::log(10000.0) / half;
  const at::Tensor angles = values.to(at::kFloat).unsqueeze(1) * at::exp(exponent).unsqueeze(0);
  return at::cat({at::cos(angles), at::sin(angles)}, -1);
}

std::string Shape(const at::Tensor& t) {
  return t.defined() ? ShapeString(t.sizes()) : std::string("undefined");
}

}  // namespace

absl::StatusOr<FluxTransformerConfig> FluxTransformerConfig::FromJson(JsonConfig json) {
  FluxTransformerConfig config;
  DRAY_RETURN_IF_ERROR(json.Get("patch_size", &config.patch_size));
  DRAY_RETURN_IF_ERROR(json.Get("in_channels", &config.in_channels));
  DRAY_RETURN_IF_ERROR(json.Get("out_channels", &config.out_channels));
  DRAY_RETURN_IF_ERROR(json.Get("num_layers", &config.num_layers));
  DRAY_RETURN_IF_ERROR(json.Get("num_single_layers", &config.num_single_layers));
  DRAY_RETURN_IF_ERROR(json.Get("attention_head_dim", &config.attention_head_dim));
  DRAY_RETURN_IF_ERROR(json.Get("num_attention_heads", &config.num_attention_heads));
  DRAY_RETURN_IF_ERROR(json.Get("joint_attention_dim", &config.joint_attention_dim));
  DRAY_RETURN_IF_ERROR(json.Get("pooled_projection_dim", &config.pooled_projection_dim));
  DRAY_RETURN_IF_ERROR(json.Get("guidance_embeds", &config.guidance_embeds));
  DRAY_RETURN_IF_ERROR(json.Get("axes_dims_rope", &config.axes_dims_rope));
  DRAY_RETURN_IF_ERROR(json.Finish());
  const int64_t rope_dims =
      std::accumulate(config.axes_dims_rope.begin(), config.axes_dims_rope.end(), int64_t{0});
  bool even = true;
  for (int64_t dim : config.axes_dims_rope) even = even && dim % 2 == 0;
  if (config.axes_dims_rope.size() != 3 || rope_dims != config.attention_head_dim || !even) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transformer config: axes_dims_rope [", absl::StrJoin(config.axes_dims_rope, ", "),
        "] must be three even sizes summing to attention_head_dim ", config.attention_head_dim));
  }
  if (config.patch_size != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transformer config: FLUX.1 packs 2x2 latents itself; dray supports patch_size 1, got ",
        config.patch_size));
  }
  return config;
}

absl::StatusOr<FluxTransformerConfig> FluxTransformerConfig::FromFile(const std::string& path) {
  DRAY_ASSIGN_OR_RETURN(JsonConfig json, JsonConfig::ReadFile(path));
  return FromJson(std::move(json));
}

std::string FluxTransformerConfig::ToJson() const {
  nlohmann::json json{{"_class_name", "FluxTransformer2DModel"},
                      {"_diffusers_version", kDiffusersVersion},
                      {"patch_size", patch_size},
                      {"in_channels", in_channels},
                      {"out_channels", nullptr},
                      {"num_layers", num_layers},
                      {"num_single_layers", num_single_layers},
                      {"attention_head_dim", attention_head_dim},
                      {"num_attention_heads", num_attention_heads},
                      {"joint_attention_dim", joint_attention_dim},
                      {"pooled_projection_dim", pooled_projection_dim},
                      {"guidance_embeds", guidance_embeds},
                      {"axes_dims_rope", axes_dims_rope}};
  if (out_channels > 0) json["out_channels"] = out_channels;
  return json.dump(2);
}

at::Tensor FluxRopeFrequencies(const at::Tensor& ids, const std::vector<int64_t>& axes_dims,
                               double theta) {
  const at::Tensor positions = ids.to(at::kFloat).to(at::kDouble);
  std::vector<at::Tensor> angles;
  for (size_t axis = 0; axis < axes_dims.size(); ++axis) {
    const int64_t dim = axes_dims[axis];
    const at::Tensor inverse = at::reciprocal(
        at::pow(theta, at::arange(0, dim, 2, positions.options()).div(static_cast<double>(dim))));
    angles.push_back(at::outer(positions.select(1, static_cast<int64_t>(axis)), inverse));
  }
  const at::Tensor all = at::cat(angles, 1);
  return at::complex(at::cos(all).to(at::kFloat), at::sin(all).to(at::kFloat));
}

SingleStreamBlockImpl::SingleStreamBlockImpl(const FluxTransformerConfig& config,
                                             at::TensorOptions options)
    : heads_(config.num_attention_heads) {
  const int64_t dim = config.inner_dim(), mlp = 4 * dim;
  norm_linear_ = RegisterAt(*this, "norm.linear", Linear(LinearOptions(dim, 3 * dim, options)));
  proj_mlp_ = RegisterAt(*this, "proj_mlp", Linear(LinearOptions(dim, mlp, options)));
  proj_out_ = RegisterAt(*this, "proj_out", Linear(LinearOptions(dim + mlp, dim, options)));
  to_q_ = RegisterAt(*this, "attn.to_q", Linear(LinearOptions(dim, dim, options)));
  to_k_ = RegisterAt(*this, "attn.to_k", Linear(LinearOptions(dim, dim, options)));
  to_v_ = RegisterAt(*this, "attn.to_v", Linear(LinearOptions(dim, dim, options)));
  norm_q_ = RegisterAt(*this, "attn.norm_q", RMSNorm(config.attention_head_dim, kEps, options));
  norm_k_ = RegisterAt(*this, "attn.norm_k", RMSNorm(config.attention_head_dim, kEps, options));
}

at::Tensor SingleStreamBlockImpl::forward(const at::Tensor& x, const at::Tensor& temb,
                                          const at::Tensor& freqs) {
  const std::vector<at::Tensor> mod = norm_linear_->forward(at::silu(temb)).chunk(3, 1);
  const at::Tensor normed = Modulate(LayerNorm(x), mod[0], mod[1]);
  const at::Tensor mlp = at::gelu(proj_mlp_->forward(normed), "tanh");
  auto heads = [this](const at::Tensor& t) { return t.unflatten(-1, {heads_, -1}); };
  const at::Tensor q = ApplyRope(norm_q_->forward(heads(to_q_->forward(normed))), freqs);
  const at::Tensor k = ApplyRope(norm_k_->forward(heads(to_k_->forward(normed))), freqs);
  const at::Tensor v = heads(to_v_->forward(normed));
  const at::Tensor attn =
      DotProductAttention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), /*allowed=*/{})
          .transpose(1, 2)
          .flatten(2, 3)
          .to(q.scalar_type());
  at::Tensor out = x + mod[2].unsqueeze(1) * proj_out_->forward(at::cat({attn, mlp}, 2));
  if (out.scalar_type() == at::kHalf) out = out.clip(-65504, 65504);  // as diffusers
  return out;
}

DualStreamBlockImpl::DualStreamBlockImpl(const FluxTransformerConfig& config,
                                         at::TensorOptions options) {
  const int64_t dim = config.inner_dim();
  norm1_ = RegisterAt(*this, "norm1.linear", Linear(LinearOptions(dim, 6 * dim, options)));
  norm1_context_ =
      RegisterAt(*this, "norm1_context.linear", Linear(LinearOptions(dim, 6 * dim, options)));
  attn_ = RegisterAt(
      *this, "attn",
      JointAttention(dim, config.num_attention_heads, config.attention_head_dim, options));
  ff_ = RegisterAt(*this, "ff", FeedForward(dim, options));
  ff_context_ = RegisterAt(*this, "ff_context", FeedForward(dim, options));
}

std::pair<at::Tensor, at::Tensor> DualStreamBlockImpl::forward(const at::Tensor& image,
                                                               const at::Tensor& text,
                                                               const at::Tensor& temb,
                                                               const at::Tensor& image_freqs,
                                                               const at::Tensor& text_freqs) {
  // shift, scale, gate for attention, then for the MLP.
  const std::vector<at::Tensor> img = norm1_->forward(at::silu(temb)).chunk(6, 1);
  const std::vector<at::Tensor> txt = norm1_context_->forward(at::silu(temb)).chunk(6, 1);
  const auto [img_attn, txt_attn] =
      attn_->forward(Modulate(LayerNorm(image), img[0], img[1]),
                     Modulate(LayerNorm(text), txt[0], txt[1]), image_freqs, text_freqs, {});
  at::Tensor image_out = image + img[2].unsqueeze(1) * img_attn;
  image_out = image_out +
              img[5].unsqueeze(1) * ff_->forward(Modulate(LayerNorm(image_out), img[3], img[4]));
  at::Tensor text_out = text + txt[2].unsqueeze(1) * txt_attn;
  text_out = text_out + txt[5].unsqueeze(1) *
                            ff_context_->forward(Modulate(LayerNorm(text_out), txt[3], txt[4]));
  if (text_out.scalar_type() == at::kHalf) text_out = text_out.clip(-65504, 65504);
  return {text_out, image_out};
}

FluxTransformerImpl::FluxTransformerImpl(FluxTransformerConfig config, at::TensorOptions options)
    : config_(std::move(config)) {
  const int64_t dim = config_.inner_dim();
  auto linear = [&](const char* path, int64_t in, int64_t out) {
    return RegisterAt(*this, path, Linear(LinearOptions(in, out, options)));
  };
  time_1_ = linear("time_text_embed.timestep_embedder.linear_1", kTimestepChannels, dim);
  time_2_ = linear("time_text_embed.timestep_embedder.linear_2", dim, dim);
  if (config_.guidance_embeds) {
    guidance_1_ = linear("time_text_embed.guidance_embedder.linear_1", kTimestepChannels, dim);
    guidance_2_ = linear("time_text_embed.guidance_embedder.linear_2", dim, dim);
  }
  text_1_ = linear("time_text_embed.text_embedder.linear_1", config_.pooled_projection_dim, dim);
  text_2_ = linear("time_text_embed.text_embedder.linear_2", dim, dim);
  context_embedder_ = linear("context_embedder", config_.joint_attention_dim, dim);
  x_embedder_ = linear("x_embedder", config_.in_channels, dim);
  transformer_blocks_ = register_module("transformer_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    transformer_blocks_->push_back(DualStreamBlock(config_, options));
  }
  single_transformer_blocks_ =
      register_module("single_transformer_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.num_single_layers; ++i) {
    single_transformer_blocks_->push_back(SingleStreamBlock(config_, options));
  }
  norm_out_linear_ = linear("norm_out.linear", dim, 2 * dim);
  proj_out_ =
      linear("proj_out", dim, config_.patch_size * config_.patch_size * config_.output_channels());
}

std::vector<std::shared_ptr<torch::nn::Module>> FluxTransformerImpl::blocks() const {
  std::vector<std::shared_ptr<torch::nn::Module>> units(transformer_blocks_->begin(),
                                                        transformer_blocks_->end());
  units.insert(units.end(), single_transformer_blocks_->begin(), single_transformer_blocks_->end());
  return units;
}

absl::Status FluxTransformerImpl::CheckInputs(const FluxTransformerInputs& in) const {
  const at::Tensor& x = in.hidden_states;
  if (!x.defined() || x.dim() != 3 || x.size(2) != config_.in_channels) {
    return absl::InvalidArgumentError(absl::StrCat("transformer: hidden_states must be [B, S, ",
                                                   config_.in_channels, "], got ", Shape(x)));
  }
  const int64_t batch = x.size(0);
  const at::Tensor& text = in.encoder_hidden_states;
  if (!text.defined() || text.dim() != 3 || text.size(0) != batch ||
      text.size(2) != config_.joint_attention_dim) {
    return absl::InvalidArgumentError(absl::StrCat("transformer: encoder_hidden_states must be [",
                                                   batch, ", L, ", config_.joint_attention_dim,
                                                   "], got ", Shape(text)));
  }
  const at::Tensor& pooled = in.pooled_projections;
  if (!pooled.defined() || pooled.dim() != 2 || pooled.size(0) != batch ||
      pooled.size(1) != config_.pooled_projection_dim) {
    return absl::InvalidArgumentError(absl::StrCat("transformer: pooled_projections must be [",
                                                   batch, ", ", config_.pooled_projection_dim,
                                                   "], got ", Shape(pooled)));
  }
  for (const auto& [name, t] : {std::pair{"timestep", in.timestep}, {"guidance", in.guidance}}) {
    const bool wanted = name != std::string("guidance") || config_.guidance_embeds;
    if (wanted && (!t.defined() || t.dim() != 1 || t.size(0) != batch)) {
      return absl::InvalidArgumentError(
          absl::StrCat("transformer: ", name, " must be [", batch, "], got ", Shape(t)));
    }
  }
  for (const auto& [name, ids, length] :
       {std::tuple{"img_ids", in.img_ids, x.size(1)}, {"txt_ids", in.txt_ids, text.size(1)}}) {
    if (!ids.defined() || ids.dim() != 2 || ids.size(0) != length ||
        ids.size(1) != static_cast<int64_t>(config_.axes_dims_rope.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("transformer: ", name, " must be [", length, ", 3], got ", Shape(ids)));
    }
  }
  return absl::OkStatus();
}

at::Tensor FluxTransformerImpl::Conditioning(const FluxTransformerInputs& in,
                                             at::ScalarType dtype) {
  // diffusers multiplies by 1000 in the compute dtype, then embeds in float32.
  auto embed = [&](const at::Tensor& value, Linear& first, Linear& second) {
    const at::Tensor projected = Sinusoid(value.to(dtype) * 1000).to(dtype);
    return second->forward(at::silu(first->forward(projected)));
  };
  at::Tensor temb = embed(in.timestep, time_1_, time_2_);
  if (config_.guidance_embeds) temb = temb + embed(in.guidance, guidance_1_, guidance_2_);
  return temb + text_2_->forward(at::silu(text_1_->forward(in.pooled_projections.to(dtype))));
}

void FluxTransformerImpl::RunDualBlock(size_t index, at::Tensor& image, at::Tensor& text,
                                       const at::Tensor& temb, const at::Tensor& image_freqs,
                                       const at::Tensor& text_freqs) {
  if (unit_hooks_ != nullptr) unit_hooks_->BeforeUnit(index);
  DualStreamBlockImpl* block = transformer_blocks_[index]->as<DualStreamBlockImpl>();
  if (checkpoint_blocks_) {
    // Captured by value: the recomputation runs in backward, after forward returned.
    const std::vector<at::Tensor> outputs = CheckpointedForward(
        [block, image_freqs, text_freqs](const std::vector<at::Tensor>& in) {
          const auto [txt, img] = block->forward(in[0], in[1], in[2], image_freqs, text_freqs);
          return std::vector<at::Tensor>{txt, img};
        },
        {image, text, temb});
    text = outputs[0];
    image = outputs[1];
  } else {
    std::tie(text, image) = block->forward(image, text, temb, image_freqs, text_freqs);
  }
  if (unit_hooks_ != nullptr) unit_hooks_->AfterUnit(index, {text, image});
}

at::Tensor FluxTransformerImpl::RunSingleBlock(size_t index, const at::Tensor& x,
                                               const at::Tensor& temb, const at::Tensor& freqs) {
  if (unit_hooks_ != nullptr) unit_hooks_->BeforeUnit(index);
  SingleStreamBlockImpl* block =
      single_transformer_blocks_[index - transformer_blocks_->size()]->as<SingleStreamBlockImpl>();
  at::Tensor out;
  if (checkpoint_blocks_) {
    out = CheckpointedForward(
        [block, freqs](const std::vector<at::Tensor>& in) {
          return std::vector<at::Tensor>{block->forward(in[0], in[1], freqs)};
        },
        {x, temb})[0];
  } else {
    out = block->forward(x, temb, freqs);
  }
  if (unit_hooks_ != nullptr) unit_hooks_->AfterUnit(index, {out});
  return out;
}

absl::StatusOr<at::Tensor> FluxTransformerImpl::forward(const FluxTransformerInputs& inputs) {
  DRAY_RETURN_IF_ERROR(CheckInputs(inputs));
  if (unit_hooks_ != nullptr) unit_hooks_->BeforeForward();
  // Compute in the parameters' dtype (e.g. bfloat16 under mixed precision).
  const at::ScalarType dtype = x_embedder_->weight.scalar_type();
  at::Tensor image = x_embedder_->forward(inputs.hidden_states.to(dtype));
  const at::Tensor temb = Conditioning(inputs, dtype);
  at::Tensor text = context_embedder_->forward(inputs.encoder_hidden_states.to(dtype));
  const at::Tensor freqs =
      FluxRopeFrequencies(at::cat({inputs.txt_ids, inputs.img_ids}, 0), config_.axes_dims_rope)
          .to(image.device());
  const int64_t text_length = text.size(1);
  const at::Tensor text_freqs = freqs.slice(0, 0, text_length);
  const at::Tensor image_freqs = freqs.slice(0, text_length);

  for (size_t i = 0; i < transformer_blocks_->size(); ++i) {
    RunDualBlock(i, image, text, temb, image_freqs, text_freqs);
  }
  at::Tensor joint = at::cat({text, image}, 1);
  for (size_t i = 0; i < single_transformer_blocks_->size(); ++i) {
    joint = RunSingleBlock(transformer_blocks_->size() + i, joint, temb, freqs);
  }
  image = joint.slice(1, text_length);
  // AdaLayerNormContinuous: scale first, then shift.
  const std::vector<at::Tensor> scale_shift =
      norm_out_linear_->forward(at::silu(temb).to(image.scalar_type())).chunk(2, 1);
  return proj_out_->forward(Modulate(LayerNorm(image), scale_shift[1], scale_shift[0]));
}

}  // namespace dray::flux
