// AutoencoderKL: the 2-D image VAE of Stable Diffusion and FLUX.1, as
// diffusers defines it (FLUX.1: 16 latent channels, no quant convs, latents
// normalized as (z - shift_factor) * scaling_factor).
//
// Encoder: conv_in, down blocks of GroupNorm/SiLU ResNet blocks with a
// stride-2 convolution after each but the last (padded right and bottom by
// one), a mid block (ResNet, single-head attention over all pixels, ResNet),
// GroupNorm, SiLU, conv_out to the mean and log-variance. The decoder
// mirrors it with nearest-neighbour 2x upsampling.
//
//   DRAY_ASSIGN_OR_RETURN(auto config, AutoencoderKLConfig::FromFile("vae/config.json"));
//   AutoencoderKL vae(config, at::TensorOptions().dtype(at::kFloat));
//   DRAY_RETURN_IF_ERROR(LoadStateDict(*vae, checkpoint));
//   DRAY_ASSIGN_OR_RETURN(GaussianLatents latents, vae->Encode(pixels));  // [B, 3, H, W] in [-1,
//   1] at::Tensor z = vae->Normalize(latents.mean);                          // what the
//   transformer sees DRAY_ASSIGN_OR_RETURN(at::Tensor image, vae->Decode(vae->Denormalize(z)));
//
// Thread-safety: not thread-safe.
#ifndef DRAY_WORKERS_MODELS_FLUX_VAE_H_
#define DRAY_WORKERS_MODELS_FLUX_VAE_H_

#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "workers/models/json_config.h"
#include "workers/models/layers.h"

namespace dray::flux {

// AutoencoderKLConfig: diffusers' config.json keys; defaults are FLUX.1's.
struct AutoencoderKLConfig {
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  int64_t latent_channels = 16;
  std::vector<int64_t> block_out_channels = {128, 256, 512, 512};
  int64_t layers_per_block = 2;
  int64_t norm_num_groups = 32;
  bool mid_block_add_attention = true;
  bool use_quant_conv = false;
  bool use_post_quant_conv = false;
  double scaling_factor = 0.3611;
  double shift_factor = 0.1159;
  int64_t sample_size = 1024;
  bool force_upcast = true;

  // spatial_compression: pixels per latent along height and width.
  int64_t spatial_compression() const { return int64_t{1} << (block_out_channels.size() - 1); }

  static absl::StatusOr<AutoencoderKLConfig> FromJson(JsonConfig json);
  static absl::StatusOr<AutoencoderKLConfig> FromFile(const std::string& path);
  // ToJson writes diffusers' config.json for this config.
  std::string ToJson() const;
};

// GaussianLatents: the diagonal Gaussian the encoder predicts.
struct GaussianLatents {
  at::Tensor mean;    // [B, latent_channels, H / f, W / f]: the mode, what pipelines use
  at::Tensor logvar;  // clamped to [-30, 20]
};

class VaeEncoderImpl;
class VaeDecoderImpl;

class AutoencoderKLImpl : public torch::nn::Module {
 public:
  AutoencoderKLImpl(AutoencoderKLConfig config, at::TensorOptions options = {});

  // Encode: pixels [B, in_channels, H, W] in [-1, 1], H and W multiples of
  // spatial_compression().
  absl::StatusOr<GaussianLatents> Encode(const at::Tensor& pixels);
  // Decode: latents [B, latent_channels, h, w] to pixels [B, out_channels,
  // h f, w f] (not clamped, as diffusers returns them).
  absl::StatusOr<at::Tensor> Decode(const at::Tensor& latents);
  // Normalize: (z - shift_factor) * scaling_factor; Denormalize undoes it.
  at::Tensor Normalize(const at::Tensor& z) const;
  at::Tensor Denormalize(const at::Tensor& z) const;

  const AutoencoderKLConfig& config() const { return config_; }

 private:
  // ParameterDtype: what the convolutions compute in.
  at::ScalarType ParameterDtype() const;

  AutoencoderKLConfig config_;
  std::shared_ptr<VaeEncoderImpl> encoder_;
  std::shared_ptr<VaeDecoderImpl> decoder_;
  Conv2d quant_conv_{nullptr}, post_quant_conv_{nullptr};
};
TORCH_MODULE(AutoencoderKL);

}  // namespace dray::flux

#endif  // DRAY_WORKERS_MODELS_FLUX_VAE_H_
