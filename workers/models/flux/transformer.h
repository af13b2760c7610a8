// FluxTransformer2DModel: FLUX.1's MMDiT (FLUX.1 Kontext's too), as
// diffusers defines it.
//
// Text tokens (T5 hidden states) and image tokens (2x2-packed VAE latents:
// the noisy image, then, for Kontext, the condition image) first run
// through dual-stream blocks (each stream its own AdaLN-Zero modulation and
// MLP, one joint attention: workers/models/joint_attention.h), then through
// single-stream blocks over the concatenated sequence (one modulation,
// attention and MLP side by side, one output projection). Every block is
// conditioned on temb = embed(t) + embed(guidance) + project(CLIP pooled).
// Positions are 3-axis ids per token (text: zeros; image: (index, row,
// column), index 1 for Kontext's condition image), rotated by RoPE.
//
// Parameter names are diffusers' state_dict names, so a diffusers
// `transformer/` directory loads as-is; each block is a sharding unit.
//
//   DRAY_ASSIGN_OR_RETURN(auto config, FluxTransformerConfig::FromFile("transformer/config.json"));
//   FluxTransformer model(config, at::TensorOptions().dtype(at::kFloat));
//   DRAY_RETURN_IF_ERROR(LoadStateDict(*model, checkpoint));
//   DRAY_ASSIGN_OR_RETURN(at::Tensor out, model->forward({tokens, text, pooled, t, guidance,
//                                                         image_ids, text_ids}));
//
// Thread-safety: not thread-safe.
#ifndef DRAY_WORKERS_MODELS_FLUX_TRANSFORMER_H_
#define DRAY_WORKERS_MODELS_FLUX_TRANSFORMER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "runtime/sharding/unit_hooks.h"
#include "workers/models/joint_attention.h"
#include "workers/models/json_config.h"
#include "workers/models/layers.h"

namespace dray::flux {

// DiffusersLoraTargets: diffusers' FLUX.1 LoRA targets
// (train_dreambooth_lora_flux.py's default): every block's attention
// projections and the dual-stream blocks' MLPs. flow_grpo's Kontext script
// adds "proj_mlp", the single-stream blocks' MLP input.
std::vector<std::string> DiffusersLoraTargets();

// FluxTransformerConfig: diffusers' config.json keys; defaults are FLUX.1's.
struct FluxTransformerConfig {
  int64_t patch_size = 1;
  int64_t in_channels = 64;  // packed latent channels (4 x VAE latent channels)
  int64_t out_channels = 0;  // 0 (null in JSON): in_channels
  int64_t num_layers = 19;   // dual-stream blocks
  int64_t num_single_layers = 38;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 4096;   // T5 width
  int64_t pooled_projection_dim = 768;  // CLIP width
  bool guidance_embeds = false;         // FLUX.1-dev and Kontext: true (guidance-distilled)
  std::vector<int64_t> axes_dims_rope = {16, 56, 56};

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  int64_t output_channels() const { return out_channels > 0 ? out_channels : in_channels; }

  static absl::StatusOr<FluxTransformerConfig> FromJson(JsonConfig json);
  static absl::StatusOr<FluxTransformerConfig> FromFile(const std::string& path);
  // ToJson writes diffusers' config.json for this config.
  std::string ToJson() const;
};

// FluxRope: FLUX.1's rotary embedding of 3-axis position ids: for each axis
// i, angles id_i * theta^(-2j / axes_dims_rope[i]) in float64, as
// complex64 frequencies [S, head_dim / 2].
at::Tensor FluxRopeFrequencies(const at::Tensor& ids, const std::vector<int64_t>& axes_dims,
                               double theta = 10000);

// SingleStreamBlockImpl: one single-stream block (the unit of sharding):
// AdaLN-Zero (norm.linear), attention (attn.to_q/k/v, attn.norm_q/k) and an
// MLP (proj_mlp) side by side, then proj_out over both.
class SingleStreamBlockImpl : public torch::nn::Module {
 public:
  SingleStreamBlockImpl(const FluxTransformerConfig& config, at::TensorOptions options);
  // x: [B, S_txt + S_img, D]; freqs: [S, head_dim / 2].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& temb, const at::Tensor& freqs);

 private:
  int64_t heads_;
  Linear norm_linear_{nullptr}, proj_mlp_{nullptr}, proj_out_{nullptr};
  Linear to_q_{nullptr}, to_k_{nullptr}, to_v_{nullptr};
  RMSNorm norm_q_{nullptr}, norm_k_{nullptr};
};
TORCH_MODULE(SingleStreamBlock);

// DualStreamBlockImpl: one dual-stream block (the unit of sharding):
// norm1/norm1_context (AdaLN-Zero), attn, ff/ff_context.
class DualStreamBlockImpl : public torch::nn::Module {
 public:
  DualStreamBlockImpl(const FluxTransformerConfig& config, at::TensorOptions options);
  // Returns {text, image}.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& image, const at::Tensor& text,
                                            const at::Tensor& temb, const at::Tensor& image_freqs,
                                            const at::Tensor& text_freqs);

 private:
  Linear norm1_{nullptr}, norm1_context_{nullptr};
  JointAttention attn_{nullptr};
  FeedForward ff_{nullptr}, ff_context_{nullptr};
};
TORCH_MODULE(DualStreamBlock);

// FluxTransformerInputs: one forward's inputs, as the pipeline passes them.
struct FluxTransformerInputs {
  at::Tensor hidden_states;          // [B, S_img, in_channels]: noisy, then condition tokens
  at::Tensor encoder_hidden_states;  // [B, S_txt, joint_attention_dim]
  at::Tensor pooled_projections;     // [B, pooled_projection_dim]
  at::Tensor timestep;               // [B], in [0, 1] (scheduler timestep / 1000)
  at::Tensor guidance;               // [B] guidance scale; undefined without guidance_embeds
  at::Tensor img_ids;                // [S_img, 3]
  at::Tensor txt_ids;                // [S_txt, 3]
};

class FluxTransformerImpl : public torch::nn::Module {
 public:
  // Builds the model with uninitialized parameters of `options` (the meta
  // device gives shapes only; LoadStateDict or InitializeLikePyTorch fills).
  FluxTransformerImpl(FluxTransformerConfig config, at::TensorOptions options = {});

  // forward predicts the flow for every image token: [B, S_img,
  // patch_size^2 * output_channels].
  absl::StatusOr<at::Tensor> forward(const FluxTransformerInputs& inputs);

  const FluxTransformerConfig& config() const { return config_; }
  // blocks: the dual-stream blocks, then the single-stream ones (sharding
  // units, in the order forward runs them).
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() const;
  // set_unit_hooks makes forward call `hooks` around each block (index in
  // blocks()); null: none. `hooks` must outlive every later forward.
  void set_unit_hooks(UnitHooks* hooks) { unit_hooks_ = hooks; }
  // set_activation_checkpointing recomputes each block in backward instead
  // of keeping its activations.
  void set_activation_checkpointing(bool enabled) { checkpoint_blocks_ = enabled; }

 private:
  absl::Status CheckInputs(const FluxTransformerInputs& inputs) const;
  // Conditioning: temb [B, inner_dim] from the timestep, guidance and pooled text.
  at::Tensor Conditioning(const FluxTransformerInputs& inputs, at::ScalarType dtype);
  // RunDualBlock / RunSingleBlock run block `index` of blocks() with hooks
  // and activation checkpointing.
  void RunDualBlock(size_t index, at::Tensor& image, at::Tensor& text, const at::Tensor& temb,
                    const at::Tensor& image_freqs, const at::Tensor& text_freqs);
  at::Tensor RunSingleBlock(size_t index, const at::Tensor& x, const at::Tensor& temb,
                            const at::Tensor& freqs);

  FluxTransformerConfig config_;
  Linear x_embedder_{nullptr}, context_embedder_{nullptr}, proj_out_{nullptr};
  Linear norm_out_linear_{nullptr};
  // time_text_embed.{timestep,guidance}_embedder.linear_{1,2} and text_embedder.linear_{1,2}
  Linear time_1_{nullptr}, time_2_{nullptr}, guidance_1_{nullptr}, guidance_2_{nullptr};
  Linear text_1_{nullptr}, text_2_{nullptr};
  torch::nn::ModuleList transformer_blocks_{nullptr}, single_transformer_blocks_{nullptr};
  UnitHooks* unit_hooks_ = nullptr;
  bool checkpoint_blocks_ = false;
};
TORCH_MODULE(FluxTransformer);

}  // namespace dray::flux

#endif  // DRAY_WORKERS_MODELS_FLUX_TRANSFORMER_H_
