#include "workers/models/layers.h"

#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include <torch/csrc/autograd/grad_mode.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/libtorch_compat.h"
#include "base/status_macros.h"
#include "runtime/sharding/tensor_storage.h"

namespace dray {
namespace {

// kMaxListed: how many names an error lists before "and N more".
constexpr size_t kMaxListed = 8;

std::string ListNames(const std::vector<std::string>& names) {
  std::vector<std::string> shown(names.begin(), names.begin() + std::min(names.size(), kMaxListed));
  std::string text = absl::StrJoin(shown, ", ");
  if (names.size() > kMaxListed)
    absl::StrAppend(&text, " and ", names.size() - kMaxListed, " more");
  return text;
}

// KeyBias: `allowed` as an additive bias, 0 where a query may attend and
// -inf where not, or undefined for no mask.
at::Tensor KeyBias(const at::Tensor& allowed, const at::TensorOptions& options) {
  if (!allowed.defined()) return {};
  return at::zeros(allowed.sizes(), options)
      .masked_fill_(allowed.logical_not(), -std::numeric_limits<double>::infinity());
}

// MaskRows: the rows of a mask (or bias) for queries [start, start+length),
// or the whole of it where it is the same for every query.
at::Tensor MaskRows(const at::Tensor& mask, int64_t queries, int64_t start, int64_t length) {
  const bool per_query = mask.dim() >= 2 && mask.size(-2) == queries && queries > 1;
  return per_query ? mask.narrow(-2, start, length) : mask;
}

// BlockwiseAttention: softmax(q k^T / sqrt(D), masked) v over blocks of
// `block` queries (rows of the softmax are independent: each block is
// exact). q, k and v are laid out for bmm once (not once a block, as matmul
// of permuted views does); a block's softmax is exp(s - max) over its sum,
// the division deferred to the output (bfloat16 and float16 go through
// at::softmax, which computes in float32). `in_place` (no gradient wanted):
// every block's scores go into one buffer (a fresh 64 MiB block costs as
// much again in page faults) and are transformed there, with results bit
// for bit those of the out-of-place operations autograd needs.
at::Tensor BlockwiseAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& allowed, int64_t block, bool in_place) {
  const int64_t queries = q.size(-2), keys = k.size(-2), depth = q.size(-1);
  std::vector<int64_t> batch(q.sizes().begin(), q.sizes().end() - 2);
  const int64_t rows = q.numel() / (queries * depth);
  auto batched = [&](const at::Tensor& t) {
    std::vector<int64_t> shape = batch;
    shape.insert(shape.end(), {t.size(-2), t.size(-1)});
    return t.expand(shape).reshape({rows, t.size(-2), t.size(-1)});
  };
  const at::Tensor scaled_q = batched(q) * (1.0 / std::sqrt(static_cast<double>(depth)));
  const at::Tensor keys_t = batched(k).transpose(1, 2), values = batched(v);
  const at::Tensor bias = KeyBias(allowed, q.options());
  const bool float_exp = q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble;
  at::Tensor buffer;
  if (in_place) buffer = at::empty({rows * std::min(block, queries) * keys}, q.options());
  std::vector<at::Tensor> blocks;
  for (int64_t start = 0; start < queries; start += block) {
    const int64_t length = std::min(block, queries - start);
    const at::Tensor block_q = scaled_q.narrow(1, start, length);
    at::Tensor scores;
    if (in_place) {
      scores = buffer.narrow(0, 0, rows * length * keys).view({rows, length, keys});
      at::bmm_out(scores, block_q, keys_t);
    } else {
      scores = at::bmm(block_q, keys_t);
    }
    if (bias.defined()) {
      std::vector<int64_t> shape = batch;
      shape.insert(shape.end(), {length, keys});
      const at::Tensor block_bias = MaskRows(bias, queries, start, length);
      if (in_place) {
        scores.view(shape).add_(block_bias);
      } else {
        scores = (scores.view(shape) + block_bias).view({rows, length, keys});
      }
    }
    if (!float_exp) {
      blocks.push_back(at::bmm(at::softmax(scores, -1), values));
      continue;
    }
    const at::Tensor max = scores.amax(-1, /*keepdim=*/true).detach();
    scores = in_place ? scores.sub_(max).exp_() : (scores - max).exp();
    const at::Tensor sums = scores.sum(-1, /*keepdim=*/true);
    blocks.push_back(in_place ? at::bmm(scores, values).div_(sums)
                              : at::bmm(scores, values) / sums);
  }
  std::vector<int64_t> shape = batch;
  shape.insert(shape.end(), {queries, v.size(-1)});
  return (blocks.size() == 1 ? blocks.front() : at::cat(blocks, 1)).view(shape);
}

thread_local bool deferring = false;
thread_local AttentionKernel attention_kernel =
    kHasFusedAttention ? AttentionKernel::kFused : AttentionKernel::kBlockwise;

}  // namespace

DeferredAllocation::DeferredAllocation() : previous_(deferring) { deferring = true; }
DeferredAllocation::~DeferredAllocation() { deferring = previous_; }
bool DeferredAllocation::active() { return deferring; }

at::Tensor NewParameter(at::IntArrayRef shape, const at::TensorOptions& options) {
  at::Tensor tensor = at::empty(shape, options);
  if (deferring && !tensor.is_meta()) ReleaseStorage(tensor);
  return tensor;
}

LinearImpl::LinearImpl(const Options& options) {
  weight = register_parameter(
      "weight", NewParameter({options.out_features, options.in_features}, options.tensor));
  if (options.bias)
    bias = register_parameter("bias", NewParameter({options.out_features}, options.tensor));
}

at::Tensor LinearImpl::forward(const at::Tensor& x) {
  at::Tensor y = at::linear(x, weight, bias);
  if (lora_A != nullptr && lora_enabled) y = y + lora_B->forward(lora_A->forward(x)) * lora_scale;
  return y;
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, at::TensorOptions options) : eps(eps) {
  weight = register_parameter("weight", NewParameter({dim}, options));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  const at::Tensor variance = AtLeastFloat32(x).pow(2).mean(-1, /*keepdim=*/true);
  at::Tensor normed = x * at::rsqrt(variance + eps);
  if (weight.scalar_type() == at::kHalf || weight.scalar_type() == at::kBFloat16) {
    normed = normed.to(weight.scalar_type());
  }
  return normed * weight;
}

Conv2dImpl::Conv2dImpl(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding,
                       at::TensorOptions options)
    : stride_(stride), padding_(padding) {
  weight = register_parameter("weight", NewParameter({out, in, kernel, kernel}, options));
  bias = register_parameter("bias", NewParameter({out}, options));
}

at::Tensor Conv2dImpl::forward(const at::Tensor& x) {
  return at::conv2d(x, weight, bias, stride_, padding_);
}

GroupNormImpl::GroupNormImpl(int64_t groups, int64_t channels, double eps,
                             at::TensorOptions options)
    : groups_(groups), eps_(eps) {
  weight = register_parameter("weight", NewParameter({channels}, options));
  bias = register_parameter("bias", NewParameter({channels}, options));
}

at::Tensor GroupNormImpl::forward(const at::Tensor& x) {
  return at::group_norm(x, groups_, weight, bias, eps_);
}

LayerNormImpl::LayerNormImpl(int64_t dim, double eps, at::TensorOptions options) : eps(eps) {
  weight = register_parameter("weight", NewParameter({dim}, options));
  bias = register_parameter("bias", NewParameter({dim}, options));
}

at::Tensor LayerNormImpl::forward(const at::Tensor& x) {
  return at::layer_norm(x, {x.size(-1)}, weight, bias, eps);
}

EmbeddingImpl::EmbeddingImpl(int64_t num_embeddings, int64_t dim, at::TensorOptions options) {
  weight = register_parameter("weight", NewParameter({num_embeddings, dim}, options));
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& ids) { return at::embedding(weight, ids); }

AttentionKernelScope::AttentionKernelScope(AttentionKernel kernel) : previous_(attention_kernel) {
  TORCH_CHECK(kernel != AttentionKernel::kFused || kHasFusedAttention,
              "fused attention needs LibTorch 2; this is ", kLibTorchVersion);
  attention_kernel = kernel;
}
AttentionKernelScope::~AttentionKernelScope() { attention_kernel = previous_; }
AttentionKernel AttentionKernelScope::current() { return attention_kernel; }

at::Tensor DotProductAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& allowed, int64_t max_score_elements) {
  if (attention_kernel == AttentionKernel::kFused) return FusedAttention(q, k, v, allowed);
  const int64_t queries = q.size(-2);
  const int64_t scores_per_query =
      std::max<int64_t>(1, q.numel() / (queries * q.size(-1))) * k.size(-2);
  const int64_t block = std::max<int64_t>(1, max_score_elements / scores_per_query);
  // Rows of the softmax are independent: each block of queries is exact.
  const bool needs_grad =
      at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  return BlockwiseAttention(q, k, v, allowed, block, /*in_place=*/!needs_grad);
}

std::shared_ptr<torch::nn::Module> RegisterModuleAt(torch::nn::Module& root,
                                                    const std::string& path,
                                                    std::shared_ptr<torch::nn::Module> module) {
  const size_t dot = path.find('.');
  if (dot == std::string::npos) return root.register_module(path, std::move(module));
  const std::string head = path.substr(0, dot);
  std::shared_ptr<torch::nn::Module> parent;
  for (const auto& child : root.named_children()) {
    if (child.key() == head) parent = child.value();
  }
  if (parent == nullptr) parent = root.register_module(head, std::make_shared<torch::nn::Module>());
  return RegisterModuleAt(*parent, path.substr(dot + 1), std::move(module));
}

void InitializeLikePyTorch(torch::nn::Module& module, at::Generator generator) {
  torch::NoGradGuard no_grad;
  // PyTorch's default for Linear and Conv layers: kaiming_uniform(a=sqrt(5))
  // for weights and the same bound for biases, i.e. U(+-1/sqrt(fan_in));
  // norm scales ("weight" or "gamma" of a norm, no fan-in) start at one,
  // norm biases at zero.
  auto initialize = [&generator](torch::nn::Module& layer) {
    const auto parameters = layer.named_parameters(/*recurse=*/false);
    const at::Tensor* weight = parameters.find("weight");
    const bool has_fan_in = weight != nullptr && weight->dim() >= 2;
    const double bound =
        has_fan_in ? 1.0 / std::sqrt(static_cast<double>(weight->numel() / weight->size(0))) : 0;
    for (const auto& parameter : parameters) {
      at::Tensor tensor = parameter.value();
      if (!HasStorage(tensor))
        continue;  // shape-only (DeferredAllocation): filled by sharding instead
      if (has_fan_in) {
        tensor.uniform_(-bound, bound, generator);
      } else {
        tensor.fill_(parameter.key() == "bias" ? 0 : 1);
      }
    }
  };
  initialize(module);  // works during construction, before a shared_ptr owns `module`
  for (const auto& child : module.named_modules("", /*include_self=*/false))
    initialize(*child.value());
}

absl::Status LoadStateDict(torch::nn::Module& module, const Checkpoint& checkpoint,
                           const std::string& prefix, const std::set<std::string>& derived) {
  torch::NoGradGuard no_grad;
  std::vector<std::string> missing, mismatched;
  std::set<std::string> expected;
  for (auto& named : module.named_parameters()) {
    const std::string name = prefix + named.key();
    expected.insert(name);
    at::Tensor& parameter = named.value();
    if (!checkpoint.contains(name)) {
      missing.push_back(name);
      continue;
    }
    absl::StatusOr<at::Tensor> loaded =
        checkpoint.Load(name, parameter.sizes(), parameter.scalar_type());
    if (!loaded.ok()) {
      mismatched.push_back(std::string(loaded.status().message()));
      continue;
    }
    parameter.copy_(*loaded);
  }
  std::vector<std::string> unexpected;
  for (const std::string& name : checkpoint.names()) {
    if (name.rfind(prefix, 0) == 0 && expected.count(name) == 0 && derived.count(name) == 0)
      unexpected.push_back(name);
  }
  if (!mismatched.empty()) return absl::InvalidArgumentError(ListNames(mismatched));
  if (!missing.empty()) {
    return absl::NotFoundError(
        absl::StrCat("the checkpoint lacks ", missing.size(), " parameters: ", ListNames(missing)));
  }
  if (!unexpected.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the checkpoint has ", unexpected.size(),
                     " tensors the model does not: ", ListNames(unexpected)));
  }
  return absl::OkStatus();
}

int64_t ParameterCount(const torch::nn::Module& module) {
  int64_t count = 0;
  for (const auto& parameter : module.parameters()) count += parameter.numel();
  return count;
}

at::Tensor AtLeastFloat32(const at::Tensor& x) {
  return x.to(at::promote_types(x.scalar_type(), at::kFloat));
}

}  // namespace dray
