#include "workers/models/qwen_image/vae.h"

#include <ATen/ATen.h>

#include <cmath>
#include <optional>

#include <nlohmann/json.hpp>

#include <torch/nn/modules/container/modulelist.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "workers/models/layers.h"

namespace dray::qwen_image {

// FeatureCache: per causal convolution (in call order), the last input frames
// of the previous chunk; `repeat` marks a temporal upsampler that has seen one
// chunk (diffusers' "Rep"). Reset `next` before each chunk.
struct FeatureCache {
  struct Entry {
    at::Tensor frames;
    bool repeat = false;
  };
  std::vector<Entry> entries;
  size_t next = 0;

  Entry& Next() {
    if (next == entries.size()) entries.emplace_back();
    return entries[next++];
  }
};

namespace {

using Triple = std::array<int64_t, 3>;  // (time, height, width)

// kCacheFrames: frames a causal 3x3x3 convolution needs from the past.
constexpr int64_t kCacheFrames = 2;

// LastFrames returns the last kCacheFrames frames of x, topped up with the
// last frame of `previous` when x has only one (diffusers' cache_x).
at::Tensor LastFrames(const at::Tensor& x, const at::Tensor& previous) {
  const int64_t frames = x.size(2);
  at::Tensor last = x.slice(2, std::max<int64_t>(0, frames - kCacheFrames)).clone();
  if (last.size(2) < kCacheFrames && previous.defined()) {
    last = at::cat({previous.slice(2, previous.size(2) - 1), last}, 2);
  }
  return last;
}

}  // namespace

// CausalConv3dImpl: Conv3d padded only towards the past in time ("weight", "bias").
class CausalConv3dImpl : public torch::nn::Module {
 public:
  CausalConv3dImpl(int64_t in, int64_t out, Triple kernel, Triple stride, Triple padding,
                   at::TensorOptions options)
      : stride_(stride), padding_{padding[2], padding[2],     padding[1],
                                  padding[1], 2 * padding[0], 0} {
    weight = register_parameter("weight",
                                NewParameter({out, in, kernel[0], kernel[1], kernel[2]}, options));
    bias = register_parameter("bias", NewParameter({out}, options));
  }

  // forward convolves x, prepending `cache` (earlier frames) in place of zeros.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cache = {}) {
    if (!cache.defined() && IsSingleFrame(x)) return ConvolveFrame(x);
    std::vector<int64_t> padding = padding_;
    at::Tensor input = x;
    if (cache.defined() && padding[4] > 0) {
      input = at::cat({cache.to(x.device()), x}, 2);
      padding[4] -= cache.size(2);
    }
    return at::conv3d(at::constant_pad_nd(input, padding, 0), weight, bias, stride_);
  }

  // Cached runs forward with this convolution's cache entry and updates it.
  at::Tensor Cached(const at::Tensor& x, FeatureCache& cache) {
    FeatureCache::Entry& entry = cache.Next();
    at::Tensor last = LastFrames(x, entry.frames);
    at::Tensor out = forward(x, entry.frames);
    entry.frames = std::move(last);
    return out;
  }

  at::Tensor weight, bias;

 private:
  // IsSingleFrame: x is one frame with no earlier ones, so the time padding
  // meets only the kernel's older slices, whose products are all zero.
  bool IsSingleFrame(const at::Tensor& x) const {
    return x.size(2) == 1 && stride_[0] == 1 && padding_[4] == weight.size(2) - 1;
  }

  // ConvolveFrame is forward for a single frame: the 2-D convolution by the
  // kernel's newest time slice, the same sum without a time axis of zeros
  // (an image's every convolution, 4-9x faster than conv3d on CPU).
  at::Tensor ConvolveFrame(const at::Tensor& x) const {
    const at::Tensor newest = weight.select(2, weight.size(2) - 1);
    return at::conv2d(x.squeeze(2), newest, bias, {stride_[1], stride_[2]},
                      {padding_[2], padding_[0]})
        .unsqueeze(2);
  }

  Triple stride_;
  std::vector<int64_t> padding_;  // F.pad order: w, w, h, h, t_before, t_after
};
TORCH_MODULE(CausalConv3d);

namespace {

// ChannelRMSNormImpl: diffusers' QwenImage_RMS_norm, L2-normalizing over
// channels, times sqrt(dim) and "gamma" ([dim, 1, 1(, 1)]).
class ChannelRMSNormImpl : public torch::nn::Module {
 public:
  ChannelRMSNormImpl(int64_t dim, bool images, at::TensorOptions options)
      : scale_(std::sqrt(static_cast<double>(dim))) {
    std::vector<int64_t> shape = {dim, 1, 1};
    if (!images) shape.push_back(1);
    gamma = register_parameter("gamma", NewParameter(shape, options));
  }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor norm = at::linalg_vector_norm(x, 2, {1}, /*keepdim=*/true).clamp_min(1e-12);
    return x / norm.expand_as(x) * scale_ * gamma;
  }

  at::Tensor gamma;

 private:
  double scale_;
};
TORCH_MODULE(ChannelRMSNorm);

// Block: anything in an encoder's down_blocks list.
class BlockImpl : public torch::nn::Module {
 public:
  virtual at::Tensor Run(const at::Tensor& x, FeatureCache& cache) = 0;
};

class ResidualBlockImpl : public BlockImpl {
 public:
  ResidualBlockImpl(int64_t in, int64_t out, at::TensorOptions options) {
    norm1_ = register_module("norm1", ChannelRMSNorm(in, false, options));
    conv1_ = register_module(
        "conv1", CausalConv3d(in, out, Triple{3, 3, 3}, Triple{1, 1, 1}, Triple{1, 1, 1}, options));
    norm2_ = register_module("norm2", ChannelRMSNorm(out, false, options));
    conv2_ = register_module("conv2", CausalConv3d(out, out, Triple{3, 3, 3}, Triple{1, 1, 1},
                                                   Triple{1, 1, 1}, options));
    if (in != out) {
      shortcut_ = register_module(
          "conv_shortcut",
          CausalConv3d(in, out, Triple{1, 1, 1}, Triple{1, 1, 1}, Triple{0, 0, 0}, options));
    }
  }
  at::Tensor Run(const at::Tensor& x, FeatureCache& cache) override {
    const at::Tensor residual = shortcut_ ? shortcut_->forward(x) : x;
    at::Tensor h = conv1_->Cached(at::silu(norm1_->forward(x)), cache);
    h = conv2_->Cached(at::silu(norm2_->forward(h)), cache);
    return h + residual;
  }

 private:
  ChannelRMSNorm norm1_{nullptr}, norm2_{nullptr};
  CausalConv3d conv1_{nullptr}, conv2_{nullptr}, shortcut_{nullptr};
};

// AttentionBlockImpl: single-head self-attention over each frame's pixels.
class AttentionBlockImpl : public torch::nn::Module {
 public:
  AttentionBlockImpl(int64_t dim, at::TensorOptions options) {
    norm_ = register_module("norm", ChannelRMSNorm(dim, true, options));
    to_qkv_ = register_module("to_qkv", Conv2d(dim, 3 * dim, 1, 1, 0, options));
    proj_ = register_module("proj", Conv2d(dim, dim, 1, 1, 0, options));
  }
  at::Tensor forward(const at::Tensor& x) {
    const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
    const at::Tensor frames = x.permute({0, 2, 1, 3, 4}).reshape({b * t, c, h, w});
    const at::Tensor qkv = to_qkv_->forward(norm_->forward(frames))
                               .reshape({b * t, 1, 3 * c, -1})
                               .permute({0, 1, 3, 2})
                               .contiguous();
    const std::vector<at::Tensor> parts = qkv.chunk(3, -1);
    at::Tensor out = DotProductAttention(parts[0], parts[1], parts[2], at::Tensor());
    out = proj_->forward(out.squeeze(1).permute({0, 2, 1}).reshape({b * t, c, h, w}));
    return out.view({b, t, c, h, w}).permute({0, 2, 1, 3, 4}) + x;
  }

 private:
  ChannelRMSNorm norm_{nullptr};
  Conv2d to_qkv_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(AttentionBlock);

// ResampleImpl: 2x spatial up/down-sampling per frame, and for the "3d" modes
// 2x temporal up/down-sampling through a causal time convolution.
class ResampleImpl : public BlockImpl {
 public:
  enum class Mode { kUpsample2d, kUpsample3d, kDownsample2d, kDownsample3d };

  ResampleImpl(int64_t dim, Mode mode, at::TensorOptions options) : mode_(mode) {
    const bool up = mode == Mode::kUpsample2d || mode == Mode::kUpsample3d;
    conv_ = RegisterAt(
        *this, "resample.1",
        up ? Conv2d(dim, dim / 2, 3, 1, 1, options) : Conv2d(dim, dim, 3, 2, 0, options));
    if (mode == Mode::kUpsample3d) {
      time_conv_ = register_module(
          "time_conv",
          CausalConv3d(dim, 2 * dim, Triple{3, 1, 1}, Triple{1, 1, 1}, Triple{1, 0, 0}, options));
    } else if (mode == Mode::kDownsample3d) {
      time_conv_ = register_module(
          "time_conv",
          CausalConv3d(dim, dim, Triple{3, 1, 1}, Triple{2, 1, 1}, Triple{0, 0, 0}, options));
    }
  }

  at::Tensor Run(const at::Tensor& input, FeatureCache& cache) override {
    at::Tensor x = input;
    const int64_t b = x.size(0), c = x.size(1);
    if (mode_ == Mode::kUpsample3d) x = UpsampleTime(x, cache);
    const int64_t t = x.size(2), h = x.size(3), w = x.size(4);
    at::Tensor frames = x.permute({0, 2, 1, 3, 4}).reshape({b * t, c, h, w});
    if (mode_ == Mode::kUpsample2d || mode_ == Mode::kUpsample3d) {
      frames = at::_upsample_nearest_exact2d(AtLeastFloat32(frames), {2 * h, 2 * w}, 2.0, 2.0)
                   .to(x.scalar_type());
    } else {
      frames = at::constant_pad_nd(frames, {0, 1, 0, 1}, 0);
    }
    frames = conv_->forward(frames);
    x = frames.view({b, t, frames.size(1), frames.size(2), frames.size(3)})
            .permute({0, 2, 1, 3, 4});
    if (mode_ == Mode::kDownsample3d) x = DownsampleTime(x, cache);
    return x;
  }

 private:
  // UpsampleTime doubles the frames of every chunk after the first.
  at::Tensor UpsampleTime(const at::Tensor& x, FeatureCache& cache) {
    FeatureCache::Entry& entry = cache.Next();
    if (!entry.repeat && !entry.frames.defined()) {
      entry.repeat = true;  // the first chunk passes through
      return x;
    }
    at::Tensor last = x.slice(2, std::max<int64_t>(0, x.size(2) - kCacheFrames)).clone();
    if (last.size(2) < kCacheFrames) {
      last = at::cat(
          {entry.repeat ? at::zeros_like(last) : entry.frames.slice(2, entry.frames.size(2) - 1),
           last},
          2);
    }
    const at::Tensor doubled =
        entry.repeat ? time_conv_->forward(x) : time_conv_->forward(x, entry.frames);
    entry.frames = last;
    entry.repeat = false;
    const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
    const at::Tensor pairs = doubled.reshape({b, 2, c, t, h, w});
    return at::stack({pairs.select(1, 0), pairs.select(1, 1)}, 3).reshape({b, c, 2 * t, h, w});
  }

  // DownsampleTime halves the frames of every chunk after the first.
  at::Tensor DownsampleTime(const at::Tensor& x, FeatureCache& cache) {
    FeatureCache::Entry& entry = cache.Next();
    if (!entry.frames.defined()) {
      entry.frames = x.clone();  // the first chunk passes through
      return x;
    }
    at::Tensor last = x.slice(2, x.size(2) - 1).clone();
    at::Tensor out =
        time_conv_->forward(at::cat({entry.frames.slice(2, entry.frames.size(2) - 1), x}, 2));
    entry.frames = std::move(last);
    return out;
  }

  Mode mode_;
  Conv2d conv_{nullptr};
  CausalConv3d time_conv_{nullptr};
};

// MidBlockImpl: residual, attention, residual.
class MidBlockImpl : public torch::nn::Module {
 public:
  MidBlockImpl(int64_t dim, at::TensorOptions options) {
    first_ = RegisterAt(*this, "resnets.0", std::make_shared<ResidualBlockImpl>(dim, dim, options));
    attention_ = RegisterAt(*this, "attentions.0", AttentionBlock(dim, options));
    second_ =
        RegisterAt(*this, "resnets.1", std::make_shared<ResidualBlockImpl>(dim, dim, options));
  }
  at::Tensor Run(const at::Tensor& x, FeatureCache& cache) {
    return second_->Run(attention_->forward(first_->Run(x, cache)), cache);
  }

 private:
  std::shared_ptr<ResidualBlockImpl> first_, second_;
  AttentionBlock attention_{nullptr};
};

// Head: norm_out, SiLU, conv_out (cached): the end of encoder and decoder.
at::Tensor Head(ChannelRMSNormImpl& norm, CausalConv3dImpl& conv, const at::Tensor& x,
                FeatureCache& cache) {
  return conv.Cached(at::silu(norm.forward(x)), cache);
}

}  // namespace

class EncoderImpl : public torch::nn::Module {
 public:
  EncoderImpl(const VaeConfig& config, at::TensorOptions options) {
    std::vector<int64_t> dims = {config.base_dim};
    for (int64_t mult : config.dim_mult) dims.push_back(config.base_dim * mult);
    conv_in_ = RegisterAt(*this, "conv_in",
                          CausalConv3d(config.input_channels, dims[0], Triple{3, 3, 3},
                                       Triple{1, 1, 1}, Triple{1, 1, 1}, options));
    down_blocks_ = register_module("down_blocks", torch::nn::ModuleList());
    for (size_t i = 0; i + 1 < dims.size(); ++i) {
      int64_t in = dims[i];
      for (int64_t r = 0; r < config.num_res_blocks; ++r) {
        down_blocks_->push_back(std::make_shared<ResidualBlockImpl>(in, dims[i + 1], options));
        in = dims[i + 1];
      }
      if (i != config.dim_mult.size() - 1) {
        down_blocks_->push_back(std::make_shared<ResampleImpl>(
            dims[i + 1],
            config.temperal_downsample[i] ? ResampleImpl::Mode::kDownsample3d
                                          : ResampleImpl::Mode::kDownsample2d,
            options));
      }
    }
    mid_block_ =
        RegisterAt(*this, "mid_block", std::make_shared<MidBlockImpl>(dims.back(), options));
    norm_out_ = RegisterAt(*this, "norm_out", ChannelRMSNorm(dims.back(), false, options));
    conv_out_ = RegisterAt(*this, "conv_out",
                           CausalConv3d(dims.back(), 2 * config.z_dim, Triple{3, 3, 3},
                                        Triple{1, 1, 1}, Triple{1, 1, 1}, options));
  }

  at::Tensor Run(const at::Tensor& x, FeatureCache& cache) {
    at::Tensor h = conv_in_->Cached(x, cache);
    for (const auto& block : *down_blocks_)
      h = std::dynamic_pointer_cast<BlockImpl>(block)->Run(h, cache);
    return Head(*norm_out_, *conv_out_, mid_block_->Run(h, cache), cache);
  }

 private:
  CausalConv3d conv_in_{nullptr}, conv_out_{nullptr};
  torch::nn::ModuleList down_blocks_{nullptr};
  std::shared_ptr<MidBlockImpl> mid_block_;
  ChannelRMSNorm norm_out_{nullptr};
};

class DecoderImpl : public torch::nn::Module {
 public:
  DecoderImpl(const VaeConfig& config, at::TensorOptions options) {
    std::vector<int64_t> dims = {config.base_dim * config.dim_mult.back()};
    for (auto it = config.dim_mult.rbegin(); it != config.dim_mult.rend(); ++it)
      dims.push_back(config.base_dim * *it);
    conv_in_ = RegisterAt(*this, "conv_in",
                          CausalConv3d(config.z_dim, dims[0], Triple{3, 3, 3}, Triple{1, 1, 1},
                                       Triple{1, 1, 1}, options));
    mid_block_ = RegisterAt(*this, "mid_block", std::make_shared<MidBlockImpl>(dims[0], options));
    for (size_t i = 0; i + 1 < dims.size(); ++i) {
      int64_t in = i > 0 ? dims[i] / 2 : dims[i];
      std::vector<std::shared_ptr<BlockImpl>> up_block;
      for (int64_t r = 0; r <= config.num_res_blocks; ++r) {
        up_block.push_back(
            RegisterAt(*this, absl::StrCat("up_blocks.", i, ".resnets.", r),
                       std::make_shared<ResidualBlockImpl>(in, dims[i + 1], options)));
        in = dims[i + 1];
      }
      if (i != config.dim_mult.size() - 1) {
        const bool temporal = config.temperal_downsample[config.temperal_downsample.size() - 1 - i];
        up_block.push_back(
            RegisterAt(*this, absl::StrCat("up_blocks.", i, ".upsamplers.0"),
                       std::make_shared<ResampleImpl>(dims[i + 1],
                                                      temporal ? ResampleImpl::Mode::kUpsample3d
                                                               : ResampleImpl::Mode::kUpsample2d,
                                                      options)));
      }
      up_blocks_.push_back(std::move(up_block));
    }
    norm_out_ = RegisterAt(*this, "norm_out", ChannelRMSNorm(dims.back(), false, options));
    conv_out_ = RegisterAt(
        *this, "conv_out",
        CausalConv3d(dims.back(), 3, Triple{3, 3, 3}, Triple{1, 1, 1}, Triple{1, 1, 1}, options));
  }

  at::Tensor Run(const at::Tensor& x, FeatureCache& cache) {
    at::Tensor h = mid_block_->Run(conv_in_->Cached(x, cache), cache);
    for (const auto& up_block : up_blocks_) {
      for (const auto& block : up_block) h = block->Run(h, cache);
    }
    return Head(*norm_out_, *conv_out_, h, cache);
  }

 private:
  CausalConv3d conv_in_{nullptr}, conv_out_{nullptr};
  std::shared_ptr<MidBlockImpl> mid_block_;
  std::vector<std::vector<std::shared_ptr<BlockImpl>>> up_blocks_;  // resnets then upsampler
  ChannelRMSNorm norm_out_{nullptr};
};

absl::StatusOr<VaeConfig> VaeConfig::FromJson(JsonConfig json) {
  VaeConfig config;
  std::vector<int64_t> attn_scales;
  double dropout = 0;
  DRAY_RETURN_IF_ERROR(json.Get("base_dim", &config.base_dim));
  DRAY_RETURN_IF_ERROR(json.Get("z_dim", &config.z_dim));
  DRAY_RETURN_IF_ERROR(json.Get("dim_mult", &config.dim_mult));
  DRAY_RETURN_IF_ERROR(json.Get("num_res_blocks", &config.num_res_blocks));
  DRAY_RETURN_IF_ERROR(json.Get("temperal_downsample", &config.temperal_downsample));
  DRAY_RETURN_IF_ERROR(json.Get("input_channels", &config.input_channels));
  DRAY_RETURN_IF_ERROR(json.Get("latents_mean", &config.latents_mean));
  DRAY_RETURN_IF_ERROR(json.Get("latents_std", &config.latents_std));
  DRAY_RETURN_IF_ERROR(json.Get("attn_scales", &attn_scales));
  DRAY_RETURN_IF_ERROR(json.Get("dropout", &dropout));  // training only
  DRAY_RETURN_IF_ERROR(json.Finish());
  if (!attn_scales.empty())
    return absl::UnimplementedError("vae config: attn_scales other than [] are not supported");
  if (config.dim_mult.size() < 2 ||
      config.temperal_downsample.size() != config.dim_mult.size() - 1 ||
      config.num_res_blocks < 1 || config.base_dim < 1 || config.z_dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("vae config: needs dim_mult of at least 2 entries, temperal_downsample of ",
                     "one fewer, and positive base_dim, z_dim, num_res_blocks"));
  }
  if (static_cast<int64_t>(config.latents_mean.size()) != config.z_dim ||
      static_cast<int64_t>(config.latents_std.size()) != config.z_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vae config: latents_mean and latents_std need z_dim = ", config.z_dim, " entries"));
  }
  return config;
}

std::string VaeConfig::ToJson() const {
  return nlohmann::json{{"_class_name", "AutoencoderKLQwenImage"},
                        {"_diffusers_version", kDiffusersVersion},
                        {"base_dim", base_dim},
                        {"z_dim", z_dim},
                        {"dim_mult", dim_mult},
                        {"num_res_blocks", num_res_blocks},
                        {"attn_scales", nlohmann::json::array()},
                        {"temperal_downsample", temperal_downsample},
                        {"dropout", 0.0},
                        {"input_channels", input_channels},
                        {"latents_mean", latents_mean},
                        {"latents_std", latents_std}}
      .dump(2);
}

absl::StatusOr<VaeConfig> VaeConfig::FromFile(const std::string& path) {
  DRAY_ASSIGN_OR_RETURN(JsonConfig json, JsonConfig::ReadFile(path));
  return FromJson(std::move(json));
}

AutoencoderKLQwenImageImpl::AutoencoderKLQwenImageImpl(VaeConfig config, at::TensorOptions options)
    : config_(std::move(config)) {
  encoder_ = register_module("encoder", std::make_shared<EncoderImpl>(config_, options));
  quant_conv_ = register_module(
      "quant_conv",
      std::make_shared<CausalConv3dImpl>(2 * config_.z_dim, 2 * config_.z_dim, Triple{1, 1, 1},
                                         Triple{1, 1, 1}, Triple{0, 0, 0}, options));
  post_quant_conv_ = register_module(
      "post_quant_conv",
      std::make_shared<CausalConv3dImpl>(config_.z_dim, config_.z_dim, Triple{1, 1, 1},
                                         Triple{1, 1, 1}, Triple{0, 0, 0}, options));
  decoder_ = register_module("decoder", std::make_shared<DecoderImpl>(config_, options));
}

absl::StatusOr<LatentDistribution> AutoencoderKLQwenImageImpl::Encode(const at::Tensor& pixels) {
  const int64_t scale = config_.spatial_compression();
  if (!pixels.defined() || pixels.dim() != 5 || pixels.size(1) != config_.input_channels ||
      pixels.size(3) % scale != 0 || pixels.size(4) % scale != 0 || (pixels.size(2) - 1) % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("VAE encode needs [B, ", config_.input_channels,
                     ", 1 + 4k, H, W] with H and W multiples of ", scale, ", got [",
                     pixels.defined() ? absl::StrJoin(pixels.sizes(), ", ") : "undefined", "]"));
  }
  FeatureCache cache;
  std::vector<at::Tensor> chunks;
  for (int64_t start = 0; start < pixels.size(2); start += (start == 0 ? 1 : 4)) {
    cache.next = 0;
    chunks.push_back(encoder_->Run(pixels.slice(2, start, start == 0 ? 1 : start + 4), cache));
  }
  LatentDistribution dist;
  dist.parameters = quant_conv_->forward(at::cat(chunks, 2));
  const std::vector<at::Tensor> halves = dist.parameters.chunk(2, 1);
  dist.mean = halves[0];
  dist.logvar = at::clamp(halves[1], -30.0, 20.0);
  dist.std = at::exp(0.5 * dist.logvar);
  dist.var = at::exp(dist.logvar);
  return dist;
}

absl::StatusOr<at::Tensor> AutoencoderKLQwenImageImpl::Decode(const at::Tensor& latents) {
  if (!latents.defined() || latents.dim() != 5 || latents.size(1) != config_.z_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("VAE decode needs [B, ", config_.z_dim, ", T, h, w], got [",
                     latents.defined() ? absl::StrJoin(latents.sizes(), ", ") : "undefined", "]"));
  }
  const at::Tensor x = post_quant_conv_->forward(latents);
  FeatureCache cache;
  std::vector<at::Tensor> frames;
  for (int64_t t = 0; t < x.size(2); ++t) {
    cache.next = 0;
    frames.push_back(decoder_->Run(x.slice(2, t, t + 1), cache));
  }
  return at::clamp(at::cat(frames, 2), -1.0, 1.0);
}

at::Tensor AutoencoderKLQwenImageImpl::Normalize(const at::Tensor& latents) const {
  const at::Tensor mean =
      at::tensor(config_.latents_mean, at::kFloat).to(latents.options()).view({1, -1, 1, 1, 1});
  const at::Tensor std =
      at::tensor(config_.latents_std, at::kFloat).to(latents.options()).view({1, -1, 1, 1, 1});
  return (latents - mean) / std;
}

at::Tensor AutoencoderKLQwenImageImpl::Denormalize(const at::Tensor& latents) const {
  const at::Tensor mean =
      at::tensor(config_.latents_mean, at::kFloat).to(latents.options()).view({1, -1, 1, 1, 1});
  const at::Tensor inverse_std = (1.0 / at::tensor(config_.latents_std, at::kFloat))
                                     .to(latents.options())
                                     .view({1, -1, 1, 1, 1});
  return latents / inverse_std + mean;
}

}  // namespace dray::qwen_image
