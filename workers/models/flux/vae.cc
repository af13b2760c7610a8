#include "workers/models/flux/vae.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/shape_string.h"
#include "base/status_macros.h"

namespace dray::flux {
namespace {

constexpr double kNormEps = 1e-6;
constexpr char kDownBlock[] = "DownEncoderBlock2D";
constexpr char kUpBlock[] = "UpDecoderBlock2D";

// ResnetBlockImpl: diffusers' ResnetBlock2D without a time embedding.
class ResnetBlockImpl : public torch::nn::Module {
 public:
  ResnetBlockImpl(int64_t in, int64_t out, int64_t groups, at::TensorOptions options) {
    norm1_ = RegisterAt(*this, "norm1", GroupNorm(groups, in, kNormEps, options));
    conv1_ = RegisterAt(*this, "conv1", Conv2d(in, out, 3, 1, 1, options));
    norm2_ = RegisterAt(*this, "norm2", GroupNorm(groups, out, kNormEps, options));
    conv2_ = RegisterAt(*this, "conv2", Conv2d(out, out, 3, 1, 1, options));
    if (in != out)
      shortcut_ = RegisterAt(*this, "conv_shortcut", Conv2d(in, out, 1, 1, 0, options));
  }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = conv1_->forward(at::silu(norm1_->forward(x)));
    const at::Tensor out = conv2_->forward(at::silu(norm2_->forward(h)));
    return (shortcut_ ? shortcut_->forward(x) : x) + out;
  }

 private:
  GroupNorm norm1_{nullptr}, norm2_{nullptr};
  Conv2d conv1_{nullptr}, conv2_{nullptr}, shortcut_{nullptr};
};
TORCH_MODULE(ResnetBlock);

// SpatialAttentionImpl: diffusers' single-head Attention over all pixels,
// with its group norm and residual connection.
class SpatialAttentionImpl : public torch::nn::Module {
 public:
  SpatialAttentionImpl(int64_t channels, int64_t groups, at::TensorOptions options) {
    norm_ = RegisterAt(*this, "group_norm", GroupNorm(groups, channels, kNormEps, options));
    auto linear = [&](const char* name) {
      return RegisterAt(*this, name,
                        Linear(LinearImpl::Options{channels, channels, true, options}));
    };
    to_q_ = linear("to_q");
    to_k_ = linear("to_k");
    to_v_ = linear("to_v");
    to_out_ = linear("to_out.0");
  }
  at::Tensor forward(const at::Tensor& x) {
    const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
    const at::Tensor pixels = norm_->forward(x).view({b, c, h * w}).transpose(1, 2);
    const at::Tensor attended =
        DotProductAttention(to_q_->forward(pixels).unsqueeze(1),
                            to_k_->forward(pixels).unsqueeze(1),
                            to_v_->forward(pixels).unsqueeze(1), at::Tensor())
            .squeeze(1)
            .to(x.scalar_type());
    return to_out_->forward(attended).transpose(1, 2).reshape({b, c, h, w}) + x;
  }

 private:
  GroupNorm norm_{nullptr};
  Linear to_q_{nullptr}, to_k_{nullptr}, to_v_{nullptr}, to_out_{nullptr};
};
TORCH_MODULE(SpatialAttention);

// MidBlockImpl: diffusers' UNetMidBlock2D: ResNet, (attention), ResNet.
class MidBlockImpl : public torch::nn::Module {
 public:
  MidBlockImpl(int64_t channels, int64_t groups, bool attention, at::TensorOptions options) {
    first_ = RegisterAt(*this, "resnets.0", ResnetBlock(channels, channels, groups, options));
    if (attention)
      attention_ = RegisterAt(*this, "attentions.0", SpatialAttention(channels, groups, options));
    second_ = RegisterAt(*this, "resnets.1", ResnetBlock(channels, channels, groups, options));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = first_->forward(x);
    if (attention_) h = attention_->forward(h);
    return second_->forward(h);
  }

 private:
  ResnetBlock first_{nullptr}, second_{nullptr};
  SpatialAttention attention_{nullptr};
};
TORCH_MODULE(MidBlock);

// ResampleBlockImpl: diffusers' DownEncoderBlock2D (ResNets, then a stride-2
// convolution after padding right and bottom) or UpDecoderBlock2D (ResNets,
// then 2x nearest upsampling and a convolution).
class ResampleBlockImpl : public torch::nn::Module {
 public:
  enum class Direction { kDown, kUp };
  ResampleBlockImpl(Direction direction, int64_t in, int64_t out, int64_t layers, int64_t groups,
                    bool resample, at::TensorOptions options)
      : direction_(direction) {
    resnets_ = register_module("resnets", torch::nn::ModuleList());
    for (int64_t i = 0; i < layers; ++i)
      resnets_->push_back(ResnetBlock(i == 0 ? in : out, out, groups, options));
    if (!resample) return;
    const bool down = direction == Direction::kDown;
    resample_ = RegisterAt(*this, down ? "downsamplers.0.conv" : "upsamplers.0.conv",
                           Conv2d(out, out, 3, down ? 2 : 1, down ? 0 : 1, options));
  }
  at::Tensor forward(at::Tensor x) {
    for (const auto& resnet : *resnets_) x = resnet->as<ResnetBlockImpl>()->forward(x);
    if (!resample_) return x;
    if (direction_ == Direction::kDown)
      return resample_->forward(at::constant_pad_nd(x, {0, 1, 0, 1}, 0));
    return resample_->forward(at::upsample_nearest2d(x, {x.size(2) * 2, x.size(3) * 2}));
  }

 private:
  Direction direction_;
  torch::nn::ModuleList resnets_{nullptr};
  Conv2d resample_{nullptr};
};
TORCH_MODULE(ResampleBlock);

// OutputHead: GroupNorm, SiLU, conv_out.
at::Tensor OutputHead(GroupNorm& norm, Conv2d& conv, const at::Tensor& x) {
  return conv->forward(at::silu(norm->forward(x)));
}

}  // namespace

class VaeEncoderImpl : public torch::nn::Module {
 public:
  VaeEncoderImpl(const AutoencoderKLConfig& config, at::TensorOptions options) {
    const std::vector<int64_t>& channels = config.block_out_channels;
    const int64_t groups = config.norm_num_groups;
    conv_in_ =
        RegisterAt(*this, "conv_in", Conv2d(config.in_channels, channels[0], 3, 1, 1, options));
    down_blocks_ = register_module("down_blocks", torch::nn::ModuleList());
    for (size_t i = 0; i < channels.size(); ++i) {
      down_blocks_->push_back(ResampleBlock(ResampleBlockImpl::Direction::kDown,
                                            channels[i == 0 ? 0 : i - 1], channels[i],
                                            config.layers_per_block, groups,
                                            /*resample=*/i + 1 < channels.size(), options));
    }
    mid_block_ =
        RegisterAt(*this, "mid_block",
                   MidBlock(channels.back(), groups, config.mid_block_add_attention, options));
    norm_out_ =
        RegisterAt(*this, "conv_norm_out", GroupNorm(groups, channels.back(), kNormEps, options));
    conv_out_ = RegisterAt(*this, "conv_out",
                           Conv2d(channels.back(), 2 * config.latent_channels, 3, 1, 1, options));
  }
  at::Tensor forward(const at::Tensor& pixels) {
    at::Tensor x = conv_in_->forward(pixels);
    for (const auto& block : *down_blocks_) x = block->as<ResampleBlockImpl>()->forward(x);
    return OutputHead(norm_out_, conv_out_, mid_block_->forward(x));
  }

 private:
  Conv2d conv_in_{nullptr}, conv_out_{nullptr};
  torch::nn::ModuleList down_blocks_{nullptr};
  MidBlock mid_block_{nullptr};
  GroupNorm norm_out_{nullptr};
};

class VaeDecoderImpl : public torch::nn::Module {
 public:
  VaeDecoderImpl(const AutoencoderKLConfig& config, at::TensorOptions options) {
    const std::vector<int64_t> channels(config.block_out_channels.rbegin(),
                                        config.block_out_channels.rend());
    const int64_t groups = config.norm_num_groups;
    conv_in_ =
        RegisterAt(*this, "conv_in", Conv2d(config.latent_channels, channels[0], 3, 1, 1, options));
    mid_block_ = RegisterAt(*this, "mid_block",
                            MidBlock(channels[0], groups, config.mid_block_add_attention, options));
    up_blocks_ = register_module("up_blocks", torch::nn::ModuleList());
    for (size_t i = 0; i < channels.size(); ++i) {
      up_blocks_->push_back(ResampleBlock(ResampleBlockImpl::Direction::kUp,
                                          channels[i == 0 ? 0 : i - 1], channels[i],
                                          config.layers_per_block + 1, groups,
                                          /*resample=*/i + 1 < channels.size(), options));
    }
    norm_out_ =
        RegisterAt(*this, "conv_norm_out", GroupNorm(groups, channels.back(), kNormEps, options));
    conv_out_ = RegisterAt(*this, "conv_out",
                           Conv2d(channels.back(), config.out_channels, 3, 1, 1, options));
  }
  at::Tensor forward(const at::Tensor& latents) {
    at::Tensor x = mid_block_->forward(conv_in_->forward(latents));
    for (const auto& block : *up_blocks_) x = block->as<ResampleBlockImpl>()->forward(x);
    return OutputHead(norm_out_, conv_out_, x);
  }

 private:
  Conv2d conv_in_{nullptr}, conv_out_{nullptr};
  MidBlock mid_block_{nullptr};
  torch::nn::ModuleList up_blocks_{nullptr};
  GroupNorm norm_out_{nullptr};
};

absl::StatusOr<AutoencoderKLConfig> AutoencoderKLConfig::FromJson(JsonConfig json) {
  AutoencoderKLConfig config;
  std::vector<std::string> down_blocks, up_blocks;
  std::string act_fn = "silu";
  DRAY_RETURN_IF_ERROR(json.Get("in_channels", &config.in_channels));
  DRAY_RETURN_IF_ERROR(json.Get("out_channels", &config.out_channels));
  DRAY_RETURN_IF_ERROR(json.Get("latent_channels", &config.latent_channels));
  DRAY_RETURN_IF_ERROR(json.Get("block_out_channels", &config.block_out_channels));
  DRAY_RETURN_IF_ERROR(json.Get("layers_per_block", &config.layers_per_block));
  DRAY_RETURN_IF_ERROR(json.Get("norm_num_groups", &config.norm_num_groups));
  DRAY_RETURN_IF_ERROR(json.Get("mid_block_add_attention", &config.mid_block_add_attention));
  DRAY_RETURN_IF_ERROR(json.Get("use_quant_conv", &config.use_quant_conv));
  DRAY_RETURN_IF_ERROR(json.Get("use_post_quant_conv", &config.use_post_quant_conv));
  DRAY_RETURN_IF_ERROR(json.Get("scaling_factor", &config.scaling_factor));
  DRAY_RETURN_IF_ERROR(json.Get("shift_factor", &config.shift_factor));
  DRAY_RETURN_IF_ERROR(json.Get("sample_size", &config.sample_size));
  DRAY_RETURN_IF_ERROR(json.Get("force_upcast", &config.force_upcast));
  DRAY_RETURN_IF_ERROR(json.Get("act_fn", &act_fn));
  DRAY_RETURN_IF_ERROR(json.Get("down_block_types", &down_blocks));
  DRAY_RETURN_IF_ERROR(json.Get("up_block_types", &up_blocks));
  for (const char* key : {"latents_mean", "latents_std"})
    DRAY_RETURN_IF_ERROR(json.Unsupported(key));
  DRAY_RETURN_IF_ERROR(json.Finish());
  const size_t levels = config.block_out_channels.size();
  if (levels == 0 || act_fn != "silu" ||
      down_blocks != std::vector<std::string>(levels, kDownBlock) ||
      up_blocks != std::vector<std::string>(levels, kUpBlock)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vae config: dray supports AutoencoderKL with act_fn \"silu\" and one ", kDownBlock,
        " and one ", kUpBlock, " per entry of block_out_channels (", levels, ")"));
  }
  for (int64_t channels : config.block_out_channels) {
    if (channels <= 0 || channels % config.norm_num_groups != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("vae config: block_out_channels ", channels,
                       " must be a positive multiple of norm_num_groups ", config.norm_num_groups));
    }
  }
  return config;
}

absl::StatusOr<AutoencoderKLConfig> AutoencoderKLConfig::FromFile(const std::string& path) {
  DRAY_ASSIGN_OR_RETURN(JsonConfig json, JsonConfig::ReadFile(path));
  return FromJson(std::move(json));
}

std::string AutoencoderKLConfig::ToJson() const {
  const size_t levels = block_out_channels.size();
  return nlohmann::json{{"_class_name", "AutoencoderKL"},
                        {"_diffusers_version", kDiffusersVersion},
                        {"act_fn", "silu"},
                        {"block_out_channels", block_out_channels},
                        {"down_block_types", std::vector<std::string>(levels, kDownBlock)},
                        {"force_upcast", force_upcast},
                        {"in_channels", in_channels},
                        {"latent_channels", latent_channels},
                        {"latents_mean", nullptr},
                        {"latents_std", nullptr},
                        {"layers_per_block", layers_per_block},
                        {"mid_block_add_attention", mid_block_add_attention},
                        {"norm_num_groups", norm_num_groups},
                        {"out_channels", out_channels},
                        {"sample_size", sample_size},
                        {"scaling_factor", scaling_factor},
                        {"shift_factor", shift_factor},
                        {"up_block_types", std::vector<std::string>(levels, kUpBlock)},
                        {"use_post_quant_conv", use_post_quant_conv},
                        {"use_quant_conv", use_quant_conv}}
      .dump(2);
}

AutoencoderKLImpl::AutoencoderKLImpl(AutoencoderKLConfig config, at::TensorOptions options)
    : config_(std::move(config)) {
  encoder_ = register_module("encoder", std::make_shared<VaeEncoderImpl>(config_, options));
  decoder_ = register_module("decoder", std::make_shared<VaeDecoderImpl>(config_, options));
  const int64_t moments = 2 * config_.latent_channels;
  if (config_.use_quant_conv)
    quant_conv_ = RegisterAt(*this, "quant_conv", Conv2d(moments, moments, 1, 1, 0, options));
  if (config_.use_post_quant_conv) {
    post_quant_conv_ =
        RegisterAt(*this, "post_quant_conv",
                   Conv2d(config_.latent_channels, config_.latent_channels, 1, 1, 0, options));
  }
}

absl::StatusOr<GaussianLatents> AutoencoderKLImpl::Encode(const at::Tensor& pixels) {
  const int64_t f = config_.spatial_compression();
  if (!pixels.defined() || pixels.dim() != 4 || pixels.size(1) != config_.in_channels ||
      pixels.size(2) % f != 0 || pixels.size(3) % f != 0 || pixels.size(2) == 0 ||
      pixels.size(3) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vae: encode needs pixels [B, ", config_.in_channels, ", H, W] with H and W multiples of ",
        f, ", got ", pixels.defined() ? ShapeString(pixels.sizes()) : "undefined"));
  }
  at::Tensor moments = encoder_->forward(pixels.to(ParameterDtype()));
  if (quant_conv_) moments = quant_conv_->forward(moments);
  const std::vector<at::Tensor> halves = moments.chunk(2, 1);
  return GaussianLatents{halves[0], at::clamp(halves[1], -30.0, 20.0)};
}

absl::StatusOr<at::Tensor> AutoencoderKLImpl::Decode(const at::Tensor& latents) {
  if (!latents.defined() || latents.dim() != 4 || latents.size(1) != config_.latent_channels) {
    return absl::InvalidArgumentError(
        absl::StrCat("vae: decode needs latents [B, ", config_.latent_channels, ", h, w], got ",
                     latents.defined() ? ShapeString(latents.sizes()) : "undefined"));
  }
  at::Tensor z = latents.to(ParameterDtype());
  if (post_quant_conv_) z = post_quant_conv_->forward(z);
  return decoder_->forward(z);
}

at::ScalarType AutoencoderKLImpl::ParameterDtype() const {
  return encoder_->parameters().front().scalar_type();
}

at::Tensor AutoencoderKLImpl::Normalize(const at::Tensor& z) const {
  return (z - config_.shift_factor) * config_.scaling_factor;
}

at::Tensor AutoencoderKLImpl::Denormalize(const at::Tensor& z) const {
  return z / config_.scaling_factor + config_.shift_factor;
}

}  // namespace dray::flux
