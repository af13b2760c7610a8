#include "workers/models/qwen_image/transformer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include <torch/csrc/autograd/grad_mode.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/shape_string.h"
#include "base/status_macros.h"
#include "runtime/sharding/activation_checkpoint.h"
#include "workers/models/layers.h"

namespace dray::qwen_image {
namespace {

// kRopePositions: positions per direction in the RoPE tables (as diffusers).
constexpr int64_t kRopePositions = 4096;
// kTimestepChannels: width of the sinusoidal timestep embedding.
constexpr int64_t kTimestepChannels = 256;
constexpr double kEps = 1e-6;

int64_t Tokens(const ImageShape& shape) { return shape[0] * shape[1] * shape[2]; }

// SequencePart: part `rank` of `ranks` of `x` along `dim`, the sequence
// zero-padded to a multiple of `ranks` first.
at::Tensor SequencePart(const at::Tensor& x, int64_t dim, int rank, int ranks) {
  const int64_t length = x.size(dim), part = (length + ranks - 1) / ranks;
  const int64_t start = std::min(length, rank * part), end = std::min(length, start + part);
  const at::Tensor mine = x.narrow(dim, start, end - start);
  if (end - start == part) return mine;
  std::vector<int64_t> padding = x.sizes().vec();
  padding[dim] = part - (end - start);
  return at::cat({mine, at::zeros(padding, x.options())}, dim);
}

// GatherSequence: every rank's part [B, part, C] of a sequence of `length`,
// whole, on every rank.
absl::StatusOr<at::Tensor> GatherSequence(Communicator& group, const at::Tensor& part,
                                          int64_t length) {
  const at::Tensor mine = part.contiguous();
  at::Tensor all =
      at::empty({group.world_size(), mine.size(0), mine.size(1), mine.size(2)}, mine.options());
  DRAY_RETURN_IF_ERROR(group.AllGather(mine, all));
  return all.permute({1, 0, 2, 3}).flatten(1, 2).narrow(1, 0, length);
}

// RopeTable: diffusers' rope_params for `positions`: polar(1, pos * theta^(-2i/dim)).
at::Tensor RopeTable(const at::Tensor& positions, int64_t dim, double theta) {
  const at::Tensor exponents = at::arange(0, dim, 2).to(at::kFloat).div(dim);
  const at::Tensor inverse = at::reciprocal(at::pow(theta, exponents));
  const at::Tensor angles = at::outer(positions, inverse);
  return at::polar(at::ones_like(angles), angles);
}

at::Tensor LayerNorm(const at::Tensor& x) {
  return at::layer_norm(x, {x.size(-1)}, /*weight=*/{}, /*bias=*/{}, kEps);
}

// Modulate applies AdaLN: x * (1 + scale) + shift, and returns the gate.
// With `index` ([B, S], 0 or 1), `params` holds two halves of B rows each and
// every token takes its half's parameters.
std::pair<at::Tensor, at::Tensor> Modulate(const at::Tensor& x, const at::Tensor& params,
                                           const at::Tensor& index) {
  std::vector<at::Tensor> parts = params.chunk(3, -1);  // shift, scale, gate
  for (at::Tensor& part : parts) {
    if (index.defined()) {
      const int64_t batch = part.size(0) / 2;
      part = at::where(index.unsqueeze(-1) == 0, part.slice(0, 0, batch).unsqueeze(1),
                       part.slice(0, batch).unsqueeze(1));
    } else {
      part = part.unsqueeze(1);
    }
  }
  return {x * (1 + parts[1]) + parts[0], parts[2]};
}

LinearImpl::Options LinearOptions(int64_t in, int64_t out, at::TensorOptions options) {
  return {in, out, /*bias=*/true, options};
}

}  // namespace

absl::StatusOr<TransformerConfig> TransformerConfig::FromJson(JsonConfig json) {
  TransformerConfig config;
  DRAY_RETURN_IF_ERROR(json.Get("patch_size", &config.patch_size));
  DRAY_RETURN_IF_ERROR(json.Get("in_channels", &config.in_channels));
  DRAY_RETURN_IF_ERROR(json.Get("out_channels", &config.out_channels));
  DRAY_RETURN_IF_ERROR(json.Get("num_layers", &config.num_layers));
  DRAY_RETURN_IF_ERROR(json.Get("attention_head_dim", &config.attention_head_dim));
  DRAY_RETURN_IF_ERROR(json.Get("num_attention_heads", &config.num_attention_heads));
  DRAY_RETURN_IF_ERROR(json.Get("joint_attention_dim", &config.joint_attention_dim));
  DRAY_RETURN_IF_ERROR(json.Get("axes_dims_rope", &config.axes_dims_rope));
  DRAY_RETURN_IF_ERROR(json.Get("zero_cond_t", &config.zero_cond_t));
  for (const char* key : {"guidance_embeds", "use_additional_t_cond", "use_layer3d_rope"}) {
    DRAY_RETURN_IF_ERROR(json.Unsupported(key));
  }
  DRAY_RETURN_IF_ERROR(json.Finish());
  const int64_t rope_dims =
      std::accumulate(config.axes_dims_rope.begin(), config.axes_dims_rope.end(), int64_t{0});
  if (config.axes_dims_rope.size() != 3 || rope_dims != config.attention_head_dim ||
      config.axes_dims_rope[0] % 2 || config.axes_dims_rope[1] % 2 ||
      config.axes_dims_rope[2] % 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transformer config: axes_dims_rope [", absl::StrJoin(config.axes_dims_rope, ", "),
        "] must be three even sizes summing to attention_head_dim ", config.attention_head_dim));
  }
  if (config.patch_size != 2 || config.in_channels != 4 * config.out_channels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transformer config: dray supports patch_size 2 with in_channels = 4 x out_channels, got ",
        config.patch_size, ", ", config.in_channels, ", ", config.out_channels));
  }
  return config;
}

std::string TransformerConfig::ToJson() const {
  return nlohmann::json{{"_class_name", "QwenImageTransformer2DModel"},
                        {"_diffusers_version", kDiffusersVersion},
                        {"patch_size", patch_size},
                        {"in_channels", in_channels},
                        {"out_channels", out_channels},
                        {"num_layers", num_layers},
                        {"attention_head_dim", attention_head_dim},
                        {"num_attention_heads", num_attention_heads},
                        {"joint_attention_dim", joint_attention_dim},
                        {"guidance_embeds", false},
                        {"axes_dims_rope", axes_dims_rope},
                        {"zero_cond_t", zero_cond_t}}
      .dump(2);
}

absl::StatusOr<TransformerConfig> TransformerConfig::FromFile(const std::string& path) {
  DRAY_ASSIGN_OR_RETURN(JsonConfig json, JsonConfig::ReadFile(path));
  return FromJson(std::move(json));
}

Rope::Rope(const std::vector<int64_t>& axes_dims, double theta) : axes_dims_(axes_dims) {
  const at::Tensor positive = at::arange(kRopePositions);
  const at::Tensor negative = at::arange(kRopePositions).flip(0) * -1 - 1;
  std::vector<at::Tensor> pos, neg;
  for (int64_t dim : axes_dims_) {
    pos.push_back(RopeTable(positive, dim, theta));
    neg.push_back(RopeTable(negative, dim, theta));
  }
  positive_ = at::cat(pos, 1);
  negative_ = at::cat(neg, 1);
}

at::Tensor Rope::ImageFrequencies(const ImageShape& shape, int64_t index) const {
  const auto [frames, height, width] = shape;
  std::vector<int64_t> split;
  for (int64_t dim : axes_dims_) split.push_back(dim / 2);
  const std::vector<at::Tensor> pos = positive_.split_with_sizes(split, 1);
  const std::vector<at::Tensor> neg = negative_.split_with_sizes(split, 1);
  // Centred rows and columns: -(n - n/2) .. n/2 - 1; the image's frame index.
  auto centred = [](const at::Tensor& neg_axis, const at::Tensor& pos_axis, int64_t n) {
    return at::cat({neg_axis.slice(0, kRopePositions - (n - n / 2)), pos_axis.slice(0, 0, n / 2)},
                   0);
  };
  const at::Tensor frame = pos[0]
                               .slice(0, index, index + frames)
                               .view({frames, 1, 1, -1})
                               .expand({frames, height, width, -1});
  const at::Tensor rows =
      centred(neg[1], pos[1], height).view({1, height, 1, -1}).expand({frames, height, width, -1});
  const at::Tensor cols =
      centred(neg[2], pos[2], width).view({1, 1, width, -1}).expand({frames, height, width, -1});
  return at::cat({frame, rows, cols}, -1).reshape({Tokens(shape), -1});
}

std::pair<at::Tensor, at::Tensor> Rope::Frequencies(const SampleImages& images, int64_t text_length,
                                                    at::Device device) const {
  std::vector<at::Tensor> image_freqs;
  int64_t max_extent = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    image_freqs.push_back(ImageFrequencies(images[i], static_cast<int64_t>(i)));
    max_extent = std::max({max_extent, images[i][1] / 2, images[i][2] / 2});
  }
  return {at::cat(image_freqs, 0).to(device),
          positive_.slice(0, max_extent, max_extent + text_length).to(device)};
}

TransformerBlockImpl::TransformerBlockImpl(const TransformerConfig& config,
                                           at::TensorOptions options)
    : zero_cond_t_(config.zero_cond_t) {
  const int64_t dim = config.inner_dim();
  img_mod_ = RegisterAt(*this, "img_mod.1", Linear(LinearOptions(dim, 6 * dim, options)));
  attn_ = RegisterAt(
      *this, "attn",
      JointAttention(dim, config.num_attention_heads, config.attention_head_dim, options));
  img_mlp_ = RegisterAt(*this, "img_mlp", FeedForward(dim, options));
  txt_mod_ = RegisterAt(*this, "txt_mod.1", Linear(LinearOptions(dim, 6 * dim, options)));
  txt_mlp_ = RegisterAt(*this, "txt_mlp", FeedForward(dim, options));
}

std::pair<at::Tensor, at::Tensor> TransformerBlockImpl::forward(
    const at::Tensor& image, const at::Tensor& text, const at::Tensor& temb,
    const at::Tensor& image_freqs, const at::Tensor& text_freqs, const at::Tensor& mask,
    const at::Tensor& modulate_index) {
  const std::vector<at::Tensor> img_mod = img_mod_->forward(at::silu(temb)).chunk(2, -1);
  const at::Tensor text_temb = zero_cond_t_ ? temb.chunk(2, 0)[0] : temb;
  const std::vector<at::Tensor> txt_mod = txt_mod_->forward(at::silu(text_temb)).chunk(2, -1);

  const auto [img_in, img_gate1] = Modulate(LayerNorm(image), img_mod[0], modulate_index);
  const auto [txt_in, txt_gate1] = Modulate(LayerNorm(text), txt_mod[0], {});
  const auto [img_attn, txt_attn] = attn_->forward(img_in, txt_in, image_freqs, text_freqs, mask);
  at::Tensor img = image + img_gate1 * img_attn;
  at::Tensor txt = text + txt_gate1 * txt_attn;

  const auto [img_in2, img_gate2] = Modulate(LayerNorm(img), img_mod[1], modulate_index);
  img = img + img_gate2 * img_mlp_->forward(img_in2);
  const auto [txt_in2, txt_gate2] = Modulate(LayerNorm(txt), txt_mod[1], {});
  txt = txt + txt_gate2 * txt_mlp_->forward(txt_in2);
  if (img.scalar_type() == at::kHalf) {  // keep float16 finite, as diffusers does
    img = img.clip(-65504, 65504);
    txt = txt.clip(-65504, 65504);
  }
  return {txt, img};
}

QwenImageTransformerImpl::QwenImageTransformerImpl(TransformerConfig config,
                                                   at::TensorOptions options)
    : config_(std::move(config)), rope_(config_.axes_dims_rope) {
  const int64_t dim = config_.inner_dim();
  img_in_ = RegisterAt(*this, "img_in", Linear(LinearOptions(config_.in_channels, dim, options)));
  txt_norm_ = RegisterAt(*this, "txt_norm", RMSNorm(config_.joint_attention_dim, kEps, options));
  txt_in_ =
      RegisterAt(*this, "txt_in", Linear(LinearOptions(config_.joint_attention_dim, dim, options)));
  time_linear_1_ = RegisterAt(*this, "time_text_embed.timestep_embedder.linear_1",
                              Linear(LinearOptions(kTimestepChannels, dim, options)));
  time_linear_2_ = RegisterAt(*this, "time_text_embed.timestep_embedder.linear_2",
                              Linear(LinearOptions(dim, dim, options)));
  transformer_blocks_ = register_module("transformer_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    transformer_blocks_->push_back(TransformerBlock(config_, options));
  }
  norm_out_linear_ =
      RegisterAt(*this, "norm_out.linear", Linear(LinearOptions(dim, 2 * dim, options)));
  proj_out_ = RegisterAt(
      *this, "proj_out",
      Linear(LinearOptions(dim, config_.patch_size * config_.patch_size * config_.out_channels,
                           options)));
}

at::Tensor QwenImageTransformerImpl::TimestepEmbedding(const at::Tensor& timestep,
                                                       at::ScalarType dtype) {
  // Sinusoidal embedding of t * 1000 (cos half first), then a 2-layer MLP.
  const int64_t half = kTimestepChannels / 2;
  const at::Tensor exponent =
      at::arange(0, half, timestep.options().dtype(at::kFloat)) * -std::log(10000.0) / half;
  const at::Tensor angles =
      timestep.unsqueeze(1).to(at::kFloat) * at::exp(exponent).unsqueeze(0) * 1000;
  const at::Tensor projected = at::cat({at::cos(angles), at::sin(angles)}, -1);
  return time_linear_2_->forward(at::silu(time_linear_1_->forward(projected.to(dtype))));
}

absl::Status QwenImageTransformerImpl::CheckInputs(const at::Tensor& hidden_states,
                                                   const at::Tensor& encoder_hidden_states,
                                                   const at::Tensor& text_mask,
                                                   const at::Tensor& timestep,
                                                   const std::vector<SampleImages>& images) const {
  auto shape = [](const at::Tensor& t) {
    return t.defined() ? ShapeString(t.sizes()) : std::string("undefined");
  };
  if (!hidden_states.defined() || hidden_states.dim() != 3 ||
      hidden_states.size(2) != config_.in_channels) {
    return absl::InvalidArgumentError(absl::StrCat("transformer: hidden_states must be [B, S, ",
                                                   config_.in_channels, "], got ",
                                                   shape(hidden_states)));
  }
  const int64_t batch = hidden_states.size(0);
  if (!encoder_hidden_states.defined() || encoder_hidden_states.dim() != 3 ||
      encoder_hidden_states.size(0) != batch ||
      encoder_hidden_states.size(2) != config_.joint_attention_dim) {
    return absl::InvalidArgumentError(absl::StrCat("transformer: encoder_hidden_states must be [",
                                                   batch, ", L, ", config_.joint_attention_dim,
                                                   "], got ", shape(encoder_hidden_states)));
  }
  if (text_mask.defined() && text_mask.sizes() != encoder_hidden_states.sizes().slice(0, 2)) {
    return absl::InvalidArgumentError(absl::StrCat("transformer: text mask must be [", batch, ", ",
                                                   encoder_hidden_states.size(1), "], got ",
                                                   shape(text_mask)));
  }
  if (!timestep.defined() || timestep.dim() != 1 || timestep.size(0) != batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("transformer: timestep must be [", batch, "], got ", shape(timestep)));
  }
  if (static_cast<int64_t>(images.size()) != batch) {
    return absl::InvalidArgumentError(absl::StrCat("transformer: image shapes for ", images.size(),
                                                   " samples, the batch has ", batch));
  }
  for (size_t i = 0; i < images.size(); ++i) {
    int64_t tokens = 0, max_extent = 0;
    for (const ImageShape& image : images[i]) {
      if (image[0] < 1 || image[1] < 1 || image[2] < 1 || image[1] / 2 >= kRopePositions ||
          image[2] / 2 >= kRopePositions) {
        return absl::InvalidArgumentError(absl::StrCat("transformer: sample ", i,
                                                       " has an image of ", image[0], "x", image[1],
                                                       "x", image[2], " tokens"));
      }
      tokens += Tokens(image);
      max_extent = std::max({max_extent, image[1] / 2, image[2] / 2});
    }
    // Text positions follow the largest image's extent in the RoPE table.
    if (max_extent + encoder_hidden_states.size(1) > kRopePositions) {
      return absl::InvalidArgumentError(absl::StrCat(
          "transformer: ", encoder_hidden_states.size(1), " text tokens after an image extent of ",
          max_extent, " exceed the ", kRopePositions, " RoPE positions"));
    }
    if (tokens != hidden_states.size(1) || images[i] != images[0]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "transformer: sample ", i, "'s images cover ", tokens, " tokens, hidden_states has ",
          hidden_states.size(1), " (every sample must have the same image shapes)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> QwenImageTransformerImpl::forward(
    const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
    const at::Tensor& text_mask, const at::Tensor& timestep,
    const std::vector<SampleImages>& images) {
  DRAY_RETURN_IF_ERROR(
      CheckInputs(hidden_states, encoder_hidden_states, text_mask, timestep, images));
  if (sequence_group_ != nullptr && at::GradMode::is_enabled()) {
    return absl::FailedPreconditionError(
        "transformer: sequence parallelism runs without gradients (inference and rollouts)");
  }
  if (unit_hooks_ != nullptr) unit_hooks_->BeforeForward();
  // Under sequence parallelism this rank's part of the image tokens.
  const int ranks = sequence_group_ != nullptr ? sequence_group_->world_size() : 1;
  auto own_part = [&](const at::Tensor& x, int64_t dim) {
    return ranks == 1 ? x : SequencePart(x, dim, sequence_group_->rank(), ranks);
  };
  const int64_t batch = hidden_states.size(0), image_tokens = hidden_states.size(1);
  // Compute in the parameters' dtype (e.g. bfloat16 under mixed precision).
  const at::ScalarType dtype = img_in_->weight.scalar_type();
  at::Tensor image = img_in_->forward(own_part(hidden_states.to(dtype), 1));
  at::Tensor t = timestep.to(image.scalar_type());
  at::Tensor modulate_index;
  if (config_.zero_cond_t) {
    t = at::cat({t, t * 0}, 0);
    const int64_t noisy = Tokens(images[0][0]);
    modulate_index = at::ones({batch, image_tokens}, image.options().dtype(at::kInt));
    modulate_index.slice(1, 0, noisy).fill_(0);
    modulate_index = own_part(modulate_index, 1);
  }
  at::Tensor text = txt_in_->forward(txt_norm_->forward(encoder_hidden_states.to(dtype)));
  at::Tensor temb = TimestepEmbedding(t, image.scalar_type());
  const auto [all_image_freqs, text_freqs] =
      rope_.Frequencies(images[0], text.size(1), image.device());
  const at::Tensor image_freqs = own_part(all_image_freqs, 0);
  const int64_t padding = image.size(1) * ranks - image_tokens;
  at::Tensor mask;  // over the keys [text, image tokens, padding]
  if (text_mask.defined() || padding > 0) {
    const at::TensorOptions flags = image.options().dtype(at::kBool);
    mask =
        at::cat({text_mask.defined() ? text_mask.to(flags) : at::ones({batch, text.size(1)}, flags),
                 at::ones({batch, image_tokens}, flags), at::zeros({batch, padding}, flags)},
                1);
  }
  BlockStreams streams{image, text, temb, image_freqs, text_freqs, mask, modulate_index};
  if (step_cache_ == nullptr) {
    RunBlocks(streams, 0, transformer_blocks_->size());
  } else {
    // This rank's real image tokens: the first-block residual's.
    const int64_t first_token = ranks == 1 ? 0 : sequence_group_->rank() * image.size(1);
    const int64_t real = std::clamp<int64_t>(image_tokens - first_token, 0, image.size(1));
    DRAY_RETURN_IF_ERROR(RunCachedBlocks(streams, real));
  }
  image = streams.image;
  if (feature_tap_ != nullptr) *feature_tap_ = image;
  if (config_.zero_cond_t) temb = temb.chunk(2, 0)[0];
  const std::vector<at::Tensor> scale_shift =
      norm_out_linear_->forward(at::silu(temb).to(image.scalar_type())).chunk(2, 1);
  image = LayerNorm(image) * (1 + scale_shift[0]).unsqueeze(1) + scale_shift[1].unsqueeze(1);
  const at::Tensor out = proj_out_->forward(image);
  if (ranks == 1) return out;
  return GatherSequence(*sequence_group_, out, image_tokens);
}

void QwenImageTransformerImpl::RunBlocks(BlockStreams& s, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    if (unit_hooks_ != nullptr) unit_hooks_->BeforeUnit(i);
    TransformerBlockImpl* block = transformer_blocks_[i]->as<TransformerBlockImpl>();
    if (checkpoint_blocks_) {
      // Captured by value: the recomputation runs in backward, after forward returned.
      const std::vector<at::Tensor> outputs = CheckpointedForward(
          [block, image_rope = s.image_freqs, text_rope = s.text_freqs, mask = s.mask,
           modulate_index = s.modulate_index](const std::vector<at::Tensor>& in) {
            const auto [txt, img] =
                block->forward(in[0], in[1], in[2], image_rope, text_rope, mask, modulate_index);
            return std::vector<at::Tensor>{txt, img};
          },
          {s.image, s.text, s.temb});
      s.text = outputs[0];
      s.image = outputs[1];
    } else {
      std::tie(s.text, s.image) = block->forward(s.image, s.text, s.temb, s.image_freqs,
                                                 s.text_freqs, s.mask, s.modulate_index);
    }
    if (unit_hooks_ != nullptr) unit_hooks_->AfterUnit(i, {s.text, s.image});
  }
}

absl::Status QwenImageTransformerImpl::RunCachedBlocks(BlockStreams& s, int64_t real_tokens) {
  if (unit_hooks_ != nullptr) {
    return absl::FailedPreconditionError(
        "transformer: step caching skips blocks, which sharded ranks gather together: "
        "not with FSDP");
  }
  const at::Tensor image_in = s.image;
  RunBlocks(s, 0, 1);
  at::Tensor first_residual = (s.image - image_in).narrow(1, 0, real_tokens);
  DRAY_ASSIGN_OR_RETURN(const bool reuse, step_cache_->Reuse(first_residual, sequence_group_));
  if (reuse) {
    s.image = s.image + step_cache_->image_rest();
    s.text = s.text + step_cache_->text_rest();
    return absl::OkStatus();
  }
  const at::Tensor image_first = s.image, text_first = s.text;
  RunBlocks(s, 1, transformer_blocks_->size());
  step_cache_->Store(std::move(first_residual), s.image - image_first, s.text - text_first);
  return absl::OkStatus();
}

absl::Status QwenImageTransformerImpl::set_sequence_group(Communicator* group) {
  if (group != nullptr && config_.num_attention_heads % group->world_size() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence parallelism over ", group->world_size(), " ranks needs the attention heads (",
        config_.num_attention_heads, ") to divide by it"));
  }
  sequence_group_ = group;
  for (const auto& block : *transformer_blocks_)
    block->as<TransformerBlockImpl>()->set_sequence_group(group);
  return absl::OkStatus();
}

}  // namespace dray::qwen_image
