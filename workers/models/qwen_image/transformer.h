// QwenImageTransformer2DModel: Qwen-Image's MMDiT, as diffusers defines it.
//
// Text tokens (Qwen2.5-VL hidden states) and image tokens (2x2-packed VAE
// latents: the noisy image, then condition images) run through dual-stream
// blocks: each stream has its own AdaLN modulation (shift/scale/gate, twice)
// and MLP, and both meet in one joint attention over [text, image] with
// per-head RMS-normed queries and keys, 3-axis RoPE (frame, height, width;
// image positions centred, the n-th image on frame n, text after the largest
// image extent) and padded text keys masked out.
//
// Parameter names are diffusers' state_dict names, so a diffusers
// `transformer/` directory loads as-is; each block is a sharding unit.
//
//   DRAY_ASSIGN_OR_RETURN(auto config, TransformerConfig::FromFile("transformer/config.json"));
//   QwenImageTransformer model(config, at::TensorOptions().dtype(at::kFloat));
//   DRAY_RETURN_IF_ERROR(LoadStateDict(*model, checkpoint));
//   DRAY_ASSIGN_OR_RETURN(at::Tensor out, model->forward(
//       tokens, text, text_mask, timestep, {{{1, 32, 32}, {1, 32, 32}}}));
//
// Thread-safety: not thread-safe.
#ifndef DRAY_WORKERS_MODELS_QWEN_IMAGE_TRANSFORMER_H_
#define DRAY_WORKERS_MODELS_QWEN_IMAGE_TRANSFORMER_H_

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "runtime/collectives/communicator.h"
#include "runtime/sharding/unit_hooks.h"
#include "workers/models/joint_attention.h"
#include "workers/models/json_config.h"
#include "workers/models/layers.h"
#include "workers/models/qwen_image/step_cache.h"

namespace dray::qwen_image {

// TransformerConfig: diffusers' config.json keys; defaults are the real model.
struct TransformerConfig {
  int64_t patch_size = 2;
  int64_t in_channels = 64;   // packed latent channels (4 x VAE z_dim)
  int64_t out_channels = 16;  // VAE z_dim
  int64_t num_layers = 60;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 3584;                  // text encoder width
  std::vector<int64_t> axes_dims_rope = {16, 56, 56};  // frame, height, width
  // Condition-image tokens modulated with t = 0 (later Qwen-Image-Edit releases).
  bool zero_cond_t = false;

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }

  static absl::StatusOr<TransformerConfig> FromJson(JsonConfig json);
  static absl::StatusOr<TransformerConfig> FromFile(const std::string& path);
  // ToJson writes diffusers' config.json for this config.
  std::string ToJson() const;
};

// ImageShape: (frames, height, width) of one image, in 2x2-packed tokens.
using ImageShape = std::array<int64_t, 3>;
// SampleImages: a sample's images in token order: noisy image first.
using SampleImages = std::vector<ImageShape>;

// Rope: Qwen-Image's 3-axis rotary embedding, tables built once.
class Rope {
 public:
  Rope(const std::vector<int64_t>& axes_dims, double theta = 10000);
  // Frequencies (complex64, on `device`) for the image tokens of `images` and
  // for `text_length` text tokens: {[S_img, head_dim/2], [S_txt, head_dim/2]}.
  std::pair<at::Tensor, at::Tensor> Frequencies(const SampleImages& images, int64_t text_length,
                                                at::Device device) const;

 private:
  at::Tensor ImageFrequencies(const ImageShape& shape, int64_t index) const;

  std::vector<int64_t> axes_dims_;
  at::Tensor positive_;  // [4096, head_dim/2]: positions 0..4095
  at::Tensor negative_;  // [4096, head_dim/2]: positions -4096..-1
};

// TransformerBlockImpl: one dual-stream block; the unit of sharding.
class TransformerBlockImpl : public torch::nn::Module {
 public:
  TransformerBlockImpl(const TransformerConfig& config, at::TensorOptions options);
  // Returns {text, image}. With zero_cond_t, `temb` is [2B, D] (t, then 0)
  // and `modulate_index` [B, S_img] picks the half for each image token.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& image, const at::Tensor& text,
                                            const at::Tensor& temb, const at::Tensor& image_freqs,
                                            const at::Tensor& text_freqs, const at::Tensor& mask,
                                            const at::Tensor& modulate_index);
  void set_sequence_group(Communicator* group) { attn_->set_sequence_group(group); }

 private:
  bool zero_cond_t_;
  Linear img_mod_{nullptr}, txt_mod_{nullptr};
  JointAttention attn_{nullptr};
  FeedForward img_mlp_{nullptr}, txt_mlp_{nullptr};
};
TORCH_MODULE(TransformerBlock);

class QwenImageTransformerImpl : public torch::nn::Module {
 public:
  // Builds the model with uninitialized parameters of `options` (the meta
  // device gives shapes only; LoadStateDict or InitializeLikePyTorch fills).
  QwenImageTransformerImpl(TransformerConfig config, at::TensorOptions options = {});

  // forward predicts the flow for every image token.
  //   hidden_states          [B, S_img, in_channels]: packed noisy latents, then condition latents
  //   encoder_hidden_states  [B, S_txt, joint_attention_dim]
  //   text_mask              [B, S_txt] (nonzero = real token), or undefined for all real
  //   timestep               [B], in [0, 1] (scheduler timestep / 1000)
  //   images                 per sample, its images' token shapes, in token order
  // Returns [B, S_img, patch_size^2 * out_channels].
  absl::StatusOr<at::Tensor> forward(const at::Tensor& hidden_states,
                                     const at::Tensor& encoder_hidden_states,
                                     const at::Tensor& text_mask, const at::Tensor& timestep,
                                     const std::vector<SampleImages>& images);

  const TransformerConfig& config() const { return config_; }
  // blocks: the dual-stream blocks, in order (sharding units).
  torch::nn::ModuleList blocks() const { return transformer_blocks_; }
  // set_unit_hooks makes forward call `hooks` around each block (sharding);
  // null: none. `hooks` must outlive every later forward.
  void set_unit_hooks(UnitHooks* hooks) { unit_hooks_ = hooks; }
  // set_activation_checkpointing recomputes each block in backward instead
  // of keeping its activations (less memory, one more forward of compute).
  void set_activation_checkpointing(bool enabled) { checkpoint_blocks_ = enabled; }
  // set_sequence_group splits each forward's image tokens over `group`'s P
  // ranks (Ulysses sequence parallelism, as xDiT and vLLM-Omni run it):
  // each rank runs the blocks on its part of the image tokens (padded to a
  // multiple of P) and on all of the text, and attention exchanges parts
  // for heads (all-to-all) so that each rank attends over the whole
  // sequence with H / P of the heads; the output is gathered whole on every
  // rank. Every rank must call forward with the same inputs, without
  // gradients; num_attention_heads must divide by P. null: off. `group`
  // must outlive its use.
  absl::Status set_sequence_group(Communicator* group);
  // set_step_cache makes each forward run the first block and, where
  // `cache` says so, reuse what the other blocks added at its last computed
  // pass instead of running them (StepCache); null: every block runs. Not
  // with FSDP (its ranks gather each block together). `cache` must outlive
  // its use.
  void set_step_cache(StepCache* cache) { step_cache_ = cache; }
  // set_feature_tap makes each forward also store the image tokens' hidden
  // states after the last block ([B, S_img, inner_dim], before the output
  // norm) in `*features` (a discriminator's input, DMD2's GAN); null: off.
  void set_feature_tap(at::Tensor* features) { feature_tap_ = features; }

 private:
  absl::Status CheckInputs(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                           const at::Tensor& text_mask, const at::Tensor& timestep,
                           const std::vector<SampleImages>& images) const;
  at::Tensor TimestepEmbedding(const at::Tensor& timestep, at::ScalarType dtype);
  // BlockStreams: the blocks' running image and text streams, and what
  // every block reads beside them.
  struct BlockStreams {
    at::Tensor image, text;
    at::Tensor temb, image_freqs, text_freqs, mask, modulate_index;
  };
  // RunBlocks runs blocks [begin, end) on `streams`.
  void RunBlocks(BlockStreams& streams, size_t begin, size_t end);
  // RunCachedBlocks runs the first block, then the others or what
  // step_cache_ kept of them; `real_tokens`: this rank's image tokens that
  // are not padding.
  absl::Status RunCachedBlocks(BlockStreams& streams, int64_t real_tokens);

  TransformerConfig config_;
  Rope rope_;
  Linear img_in_{nullptr}, txt_in_{nullptr}, proj_out_{nullptr};
  // time_text_embed.timestep_embedder.linear_{1,2}, norm_out.linear
  Linear time_linear_1_{nullptr}, time_linear_2_{nullptr}, norm_out_linear_{nullptr};
  RMSNorm txt_norm_{nullptr};
  torch::nn::ModuleList transformer_blocks_{nullptr};
  UnitHooks* unit_hooks_ = nullptr;
  bool checkpoint_blocks_ = false;
  Communicator* sequence_group_ = nullptr;
  StepCache* step_cache_ = nullptr;
  at::Tensor* feature_tap_ = nullptr;
};
TORCH_MODULE(QwenImageTransformer);

}  // namespace dray::qwen_image

#endif  // DRAY_WORKERS_MODELS_QWEN_IMAGE_TRANSFORMER_H_
