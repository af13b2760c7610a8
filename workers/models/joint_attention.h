// The pieces MMDiT transformers share (Qwen-Image's, FLUX.1's), under
// diffusers' parameter names: the tanh-GELU feed-forward, rotary position
// embedding by complex frequencies, and the dual-stream joint attention of
// text and image tokens (with Ulysses sequence parallelism).
//
//   JointAttention attn(dim, heads, head_dim, options);
//   auto [image_out, text_out] = attn->forward(image, text, image_freqs, text_freqs, {});
//
// Thread-safety: modules are not thread-safe.
#ifndef DRAY_WORKERS_MODELS_JOINT_ATTENTION_H_
#define DRAY_WORKERS_MODELS_JOINT_ATTENTION_H_

#include <cstdint>
#include <utility>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "runtime/collectives/communicator.h"
#include "workers/models/layers.h"

namespace dray {

// ApplyRope rotates x [B, S, H, D] by freqs [S, D/2] (complex64): each pair
// (x[2i], x[2i+1]) as one complex number, in float32 (float64 for float64 x).
at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& freqs);

// FeedForwardImpl: diffusers' FeedForward with tanh-GELU: net.0.proj, net.2.
class FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(int64_t dim, at::TensorOptions options);
  at::Tensor forward(const at::Tensor& x);

 private:
  Linear in_{nullptr}, out_{nullptr};
};
TORCH_MODULE(FeedForward);

// JointAttentionImpl: the dual-stream joint attention ("attn" in each
// dual-stream block): each stream's own q/k/v projections with per-head RMS
// norms (eps 1e-6), RoPE, one attention over [text, image], and each
// stream's own output projection (to_out.0, to_add_out).
class JointAttentionImpl : public torch::nn::Module {
 public:
  JointAttentionImpl(int64_t dim, int64_t heads, int64_t head_dim, at::TensorOptions options);
  // Returns {image output, text output}. `mask`: bool [B, S_txt + S_img]
  // (under sequence parallelism: over every rank's image tokens) or undefined.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& image, const at::Tensor& text,
                                            const at::Tensor& image_freqs,
                                            const at::Tensor& text_freqs, const at::Tensor& mask);
  // set_sequence_group: `image` holds this rank's part of the image tokens
  // (as QwenImageTransformerImpl::set_sequence_group splits them); null: all of them.
  void set_sequence_group(Communicator* group) { sequence_group_ = group; }

 private:
  // UlyssesAttention: the joint attention of this rank's image tokens and
  // all text, each rank attending over the whole sequence with its share of
  // the heads ([B, S, H, D] inputs after RoPE; [B, S, H * D] outputs).
  std::pair<at::Tensor, at::Tensor> UlyssesAttention(
      const at::Tensor& img_q, const at::Tensor& img_k, const at::Tensor& img_v,
      const at::Tensor& txt_q, const at::Tensor& txt_k, const at::Tensor& txt_v,
      const at::Tensor& mask);

  int64_t heads_;
  Communicator* sequence_group_ = nullptr;
  Linear to_q_{nullptr}, to_k_{nullptr}, to_v_{nullptr};
  Linear add_q_proj_{nullptr}, add_k_proj_{nullptr}, add_v_proj_{nullptr};
  Linear to_out_{nullptr}, to_add_out_{nullptr};
  RMSNorm norm_q_{nullptr}, norm_k_{nullptr}, norm_added_q_{nullptr}, norm_added_k_{nullptr};
};
TORCH_MODULE(JointAttention);

}  // namespace dray

#endif  // DRAY_WORKERS_MODELS_JOINT_ATTENTION_H_
