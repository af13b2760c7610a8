// AutoencoderKLQwenImage: Qwen-Image's VAE (the Wan 2.1 video VAE), as
// diffusers defines it.
//
// Causal 3D convolutions (padding only towards the past), channel RMS norms,
// residual, attention and resample blocks. Images are one-frame videos.
// Encoding runs frame 0 alone, then chunks of 4 frames; decoding runs latent
// frame by frame; a feature cache carries each causal convolution's last two
// input frames from one chunk to the next, exactly as diffusers does.
//
//   DRAY_ASSIGN_OR_RETURN(auto config, VaeConfig::FromFile("vae/config.json"));
//   AutoencoderKLQwenImage vae(config, at::TensorOptions().dtype(at::kFloat));
//   DRAY_RETURN_IF_ERROR(LoadStateDict(*vae, checkpoint));
//   DRAY_ASSIGN_OR_RETURN(LatentDistribution dist, vae->Encode(pixels));  // [B, 3, T, H, W] in
//   [-1, 1] DRAY_ASSIGN_OR_RETURN(at::Tensor image, vae->Decode(dist.mean));     // clamped to [-1,
//   1]
//
// Thread-safety: not thread-safe.
#ifndef DRAY_WORKERS_MODELS_QWEN_IMAGE_VAE_H_
#define DRAY_WORKERS_MODELS_QWEN_IMAGE_VAE_H_

#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "workers/models/json_config.h"

namespace dray::qwen_image {

// VaeConfig: diffusers' config.json keys; defaults are the real model.
struct VaeConfig {
  int64_t base_dim = 96;
  int64_t z_dim = 16;
  std::vector<int64_t> dim_mult = {1, 2, 4, 4};
  int64_t num_res_blocks = 2;
  std::vector<bool> temperal_downsample = {false, true, true};  // diffusers' spelling
  int64_t input_channels = 3;
  std::vector<double> latents_mean = {-0.7571, -0.7089, -0.9113, 0.1075,  -0.1745, 0.9653,
                                      -0.1517, 1.5508,  0.4134,  -0.0715, 0.5517,  -0.3632,
                                      -0.1922, -0.9497, 0.2503,  -0.2921};
  std::vector<double> latents_std = {2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                                     3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.916};

  // spatial_compression: pixels per latent along height and width.
  int64_t spatial_compression() const { return int64_t{1} << temperal_downsample.size(); }

  static absl::StatusOr<VaeConfig> FromJson(JsonConfig json);
  static absl::StatusOr<VaeConfig> FromFile(const std::string& path);
  // ToJson writes diffusers' config.json for this config.
  std::string ToJson() const;
};

// LatentDistribution: the diagonal Gaussian the encoder predicts.
struct LatentDistribution {
  at::Tensor parameters;  // quant_conv output [B, 2 z_dim, T', h, w]
  at::Tensor mean;        // the mode, used by the edit pipeline
  at::Tensor logvar;      // clamped to [-30, 20]
  at::Tensor std;
  at::Tensor var;
};

// FeatureCache: per causal convolution, the frames the next chunk needs.
struct FeatureCache;

class EncoderImpl;
class DecoderImpl;
class CausalConv3dImpl;

class AutoencoderKLQwenImageImpl : public torch::nn::Module {
 public:
  AutoencoderKLQwenImageImpl(VaeConfig config, at::TensorOptions options = {});

  // Encode: pixels [B, input_channels, T, H, W], H and W multiples of the
  // spatial compression, T = 1 + 4k.
  absl::StatusOr<LatentDistribution> Encode(const at::Tensor& pixels);

  // Decode: latents [B, z_dim, T, h, w] -> pixels [B, 3, 1 + 4(T - 1), 8h, 8w]
  // (for the real config), clamped to [-1, 1].
  absl::StatusOr<at::Tensor> Decode(const at::Tensor& latents);

  // Normalize maps VAE latents to the transformer's scale: (z - mean) / std;
  // Denormalize inverts it as the pipeline does: z / (1 / std) + mean.
  at::Tensor Normalize(const at::Tensor& latents) const;
  at::Tensor Denormalize(const at::Tensor& latents) const;

  const VaeConfig& config() const { return config_; }

 private:
  VaeConfig config_;
  std::shared_ptr<EncoderImpl> encoder_;
  std::shared_ptr<DecoderImpl> decoder_;
  std::shared_ptr<CausalConv3dImpl> quant_conv_, post_quant_conv_;
};
TORCH_MODULE(AutoencoderKLQwenImage);

}  // namespace dray::qwen_image

#endif  // DRAY_WORKERS_MODELS_QWEN_IMAGE_VAE_H_
