#include "workers/models/qwen_image/step_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "base/status_macros.h"

namespace dray::qwen_image {

absl::StatusOr<bool> StepCache::Reuse(const at::Tensor& first_residual, Communicator* group) {
  const int pass = passes_++;
  if (options_.threshold <= 0 || pass < options_.warmup_steps || !first_residual_.defined() ||
      first_residual_.sizes() != first_residual.sizes()) {
    return false;
  }
  // sum |r - r_last| and sum |r_last|, over every rank's tokens.
  at::Tensor sums =
      at::stack({(first_residual - first_residual_).abs().sum(), first_residual_.abs().sum()})
          .to(at::kDouble);
  if (group != nullptr) DRAY_RETURN_IF_ERROR(group->AllReduce(sums));
  sums = sums.cpu();
  const double change = sums[0].item<double>() / std::max(sums[1].item<double>(), 1e-12);
  const bool reuse = change < options_.threshold;
  reused_ += reuse ? 1 : 0;
  return reuse;
}

void StepCache::Store(at::Tensor first_residual, at::Tensor image_rest, at::Tensor text_rest) {
  first_residual_ = std::move(first_residual);
  image_rest_ = std::move(image_rest);
  text_rest_ = std::move(text_rest);
}

}  // namespace dray::qwen_image
