#include "workers/train/dmd2_classifier.h"

#include <ATen/ATen.h>

namespace dray {

Dmd2ClassifierImpl::Dmd2ClassifierImpl(int64_t dim, at::TensorOptions options) {
  norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
  hidden_ = register_module("hidden", torch::nn::Linear(dim, dim));
  logit_ = register_module("logit", torch::nn::Linear(dim, 1));
  to(options.device(), options.dtype().toScalarType());
}

at::Tensor Dmd2ClassifierImpl::forward(const at::Tensor& features, int64_t tokens) {
  const at::Tensor own = features.narrow(1, 0, tokens).to(logit_->weight.scalar_type());
  return logit_->forward(at::silu(hidden_->forward(norm_->forward(own)))).mean(1);
}

}  // namespace dray
