// Layers shared by dray's models, written for sharding and for real-size
// models that must be built without memory:
//  - every layer takes at::TensorOptions, so a model can be built on the meta
//    device (shapes only) or straight on its GPU, uninitialized;
//  - parameters are registered under diffusers' / transformers' names, so a
//    state dict loads as-is (LoadStateDict).
//
//   Linear proj(Linear::Options{in, out, /*bias=*/true, options});
//   at::Tensor y = proj->forward(x);
//
// Thread-safety: modules are not thread-safe; forward on one module from one
// thread at a time.
#ifndef DRAY_WORKERS_MODELS_LAYERS_H_
#define DRAY_WORKERS_MODELS_LAYERS_H_

#include <cstdint>
#include <set>
#include <string>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "absl/status/status.h"
#include "runtime/io/safetensors.h"

namespace dray {

// DeferredAllocation: while one is alive (on this thread), layers create
// their parameters shape-only: real tensors of the requested dtype and
// device whose storage is released at once, so a model of any size can be
// built with no more memory than its largest parameter, then filled by
// sharding (FullyShardedModule's sync_module_states or LoadShards).
//
//   { DeferredAllocation deferred; model = QwenImageTransformer(config, options); }
class DeferredAllocation {
 public:
  DeferredAllocation();
  ~DeferredAllocation();
  DeferredAllocation(const DeferredAllocation&) = delete;
  DeferredAllocation& operator=(const DeferredAllocation&) = delete;
  static bool active();

 private:
  bool previous_;
};

// Weights: whether a loader reads a model's weights, or builds the model
// shape-only (under DeferredAllocation) for a rank that receives its
// weights from rank 0 instead.
enum class Weights { kRead, kShapeOnly };

// NewParameter returns an uninitialized tensor for a layer's parameter,
// shape-only under DeferredAllocation (runtime/sharding/tensor_storage.h).
at::Tensor NewParameter(at::IntArrayRef shape, const at::TensorOptions& options);

// LinearImpl: y = x W^T + b, like torch.nn.Linear (parameters "weight",
// "bias"), optionally with a LoRA adapter (workers/models/lora.h):
// y += (alpha / rank) * B(A(x)), submodules "lora_A" and "lora_B".
class LinearImpl : public torch::nn::Module {
 public:
  struct Options {
    int64_t in_features = 0;
    int64_t out_features = 0;
    bool bias = true;
    at::TensorOptions tensor = {};  // dtype and device of the parameters
  };
  explicit LinearImpl(const Options& options);
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight, bias;
  // The adapter, when one is attached (see AddLoraAdapters).
  std::shared_ptr<LinearImpl> lora_A, lora_B;
  double lora_scale = 0;     // alpha / rank
  bool lora_enabled = true;  // off: the base layer alone (the reference policy)
};
TORCH_MODULE(Linear);

// RMSNormImpl: diffusers' RMSNorm: x / sqrt(mean(x^2) + eps) * weight,
// statistics in float32 (parameter "weight").
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, at::TensorOptions options = {});
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

// LayerNormImpl: torch.nn.LayerNorm over the last dimension (parameters
// "weight", "bias").
class LayerNormImpl : public torch::nn::Module {
 public:
  LayerNormImpl(int64_t dim, double eps, at::TensorOptions options = {});
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight, bias;
  double eps;
};
TORCH_MODULE(LayerNorm);

// EmbeddingImpl: a lookup table, like torch.nn.Embedding (parameter "weight").
class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t num_embeddings, int64_t dim, at::TensorOptions options = {});
  at::Tensor forward(const at::Tensor& ids);

  at::Tensor weight;
};
TORCH_MODULE(Embedding);

// Conv2dImpl: torch.nn.Conv2d with a square kernel (parameters "weight",
// "bias").
class Conv2dImpl : public torch::nn::Module {
 public:
  Conv2dImpl(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding,
             at::TensorOptions options = {});
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight, bias;

 private:
  int64_t stride_, padding_;
};
TORCH_MODULE(Conv2d);

// GroupNormImpl: torch.nn.GroupNorm with a per-channel affine (parameters
// "weight", "bias") over [B, C, ...].
class GroupNormImpl : public torch::nn::Module {
 public:
  GroupNormImpl(int64_t groups, int64_t channels, double eps, at::TensorOptions options = {});
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight, bias;

 private:
  int64_t groups_;
  double eps_;
};
TORCH_MODULE(GroupNorm);

// kAttentionBlockScores: how many attention scores the blockwise kernel
// holds at once (64 MiB in float32), whatever the sequence length.
inline constexpr int64_t kAttentionBlockScores = int64_t{1} << 24;

// AttentionKernel: how DotProductAttention computes.
//  kFused: at::scaled_dot_product_attention (base/libtorch_compat.h): flash
//    or memory-efficient kernels on a GPU, a flash kernel on CPU. The
//    default where LibTorch has it (2.0 and later).
//  kBlockwise: the textbook formula, as diffusers' reference SDPA computes
//    it, over blocks of queries of at most kAttentionBlockScores scores, so
//    that memory grows linearly with the sequence rather than with its
//    square. The default on LibTorch 1.13. Where no gradient is wanted it
//    works in place in one reused buffer, near the machine's matmul speed
//    (`dray bench --suite edit` reports attention_matmul_share), with the
//    results, bit for bit, of the out-of-place path autograd takes.
enum class AttentionKernel { kFused, kBlockwise };

// AttentionKernelScope: while one is alive, DotProductAttention on this
// thread uses `kernel` (as torch.nn.attention.sdpa_kernel does in Python).
// kFused needs kHasFusedAttention.
class AttentionKernelScope {
 public:
  explicit AttentionKernelScope(AttentionKernel kernel);
  ~AttentionKernelScope();
  AttentionKernelScope(const AttentionKernelScope&) = delete;
  AttentionKernelScope& operator=(const AttentionKernelScope&) = delete;
  static AttentionKernel current();

 private:
  AttentionKernel previous_;
};

// DotProductAttention: softmax(q k^T / sqrt(D) masked) v for q [..., Sq, D]
// and k, v [..., Sk, D], with AttentionKernelScope::current()'s kernel.
// `allowed` (bool, broadcastable to [..., Sq, Sk], or undefined for all)
// marks the keys each query may attend to. `max_score_elements`: the
// blockwise kernel's block.
at::Tensor DotProductAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& allowed,
                               int64_t max_score_elements = kAttentionBlockScores);

// RegisterAt registers `module` under the dotted `path` below `root`
// ("attn.to_out.0"), creating parameter-free parents on the way, so that
// parameter names match a checkpoint's without placeholder modules.
std::shared_ptr<torch::nn::Module> RegisterModuleAt(torch::nn::Module& root,
                                                    const std::string& path,
                                                    std::shared_ptr<torch::nn::Module> module);

template <typename Holder>
Holder RegisterAt(torch::nn::Module& root, const std::string& path, Holder module) {
  RegisterModuleAt(root, path, module.ptr());
  return module;
}

template <typename ModuleType>
std::shared_ptr<ModuleType> RegisterAt(torch::nn::Module& root, const std::string& path,
                                       std::shared_ptr<ModuleType> module) {
  RegisterModuleAt(root, path, module);
  return module;
}

// InitializeLikePyTorch fills every parameter of `module` with PyTorch's
// default initialization for its layer (Linear and convolutions: uniform in
// +-1/sqrt(fan_in), biases too; norm scales: ones), drawing from
// `generator`: deterministic for a seed. Shape-only parameters are skipped.
void InitializeLikePyTorch(torch::nn::Module& module, at::Generator generator);

// LoadStateDict copies every parameter of `module` from `checkpoint` (same
// names), converting to each parameter's dtype. A parameter the checkpoint
// lacks, a tensor the module lacks (other than the `derived` ones, which the
// module computes from others, e.g. a tied LM head), or a shape mismatch is
// an error listing them; nothing is left half-loaded silently.
absl::Status LoadStateDict(torch::nn::Module& module, const Checkpoint& checkpoint,
                           const std::string& prefix = "",
                           const std::set<std::string>& derived = {});

// ParameterCount returns the number of parameter elements of `module`.
int64_t ParameterCount(const torch::nn::Module& module);

// AtLeastFloat32: `x` widened to float32 if it is narrower (bfloat16,
// float16), else as it is: what models compute "in float32" (norms, RoPE,
// latents, schedulers, losses) keeps a float64 run in float64.
at::Tensor AtLeastFloat32(const at::Tensor& x);

}  // namespace dray

#endif  // DRAY_WORKERS_MODELS_LAYERS_H_
