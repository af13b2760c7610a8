// StepCache: first-block caching of a denoising loop's transformer passes
// (cache-dit's FBCache, its DBCache with F1B0; ParaAttention's first-block
// cache): each pass runs the first block, and when the image stream's
// change through it (the first-block residual) differs from the last
// computed pass's by less than `threshold` (relative L1), the other blocks
// are skipped and what they added at that pass is added again. Neighbouring
// steps of a flow-matching loop change the latents little, so in its middle
// many passes can reuse; the result is close to, not equal to, the exact one.
//
// One StepCache serves the passes of one prompt side (the prompt's and the
// negative prompt's passes differ), for one loop; QwenImageTransformerImpl
// consults it (set_step_cache).
//
// Thread-safety: not thread-safe.
#ifndef DRAY_WORKERS_MODELS_QWEN_IMAGE_STEP_CACHE_H_
#define DRAY_WORKERS_MODELS_QWEN_IMAGE_STEP_CACHE_H_

#include <ATen/core/Tensor.h>

#include "runtime/collectives/communicator.h"

namespace dray::qwen_image {

struct StepCacheOptions {
  // Largest relative L1 change of the first-block residual that reuses the
  // other blocks' (0: never reuse, the exact result).
  double threshold = 0;
  // Steps (this cache's passes) always computed at the start of the loop.
  int warmup_steps = 2;
};

class StepCache {
 public:
  explicit StepCache(StepCacheOptions options) : options_(options) {}

  // Reuse says whether this pass may skip the blocks after the first, given
  // its first-block residual [B, S, D] (this rank's real image tokens; the
  // sums behind the relative change are all-reduced over `group`, the
  // sequence-parallel ranks, when there is one: they decide alike). It
  // counts the pass.
  absl::StatusOr<bool> Reuse(const at::Tensor& first_residual, Communicator* group);

  // Store keeps a computed pass's first-block residual and what the other
  // blocks added to the image and text streams.
  void Store(at::Tensor first_residual, at::Tensor image_rest, at::Tensor text_rest);

  const at::Tensor& image_rest() const { return image_rest_; }
  const at::Tensor& text_rest() const { return text_rest_; }
  int passes() const { return passes_; }
  int reused() const { return reused_; }

 private:
  StepCacheOptions options_;
  int passes_ = 0, reused_ = 0;
  at::Tensor first_residual_, image_rest_, text_rest_;  // of the last computed pass
};

}  // namespace dray::qwen_image

#endif  // DRAY_WORKERS_MODELS_QWEN_IMAGE_STEP_CACHE_H_
