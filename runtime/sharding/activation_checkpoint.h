// Activation checkpointing: run a unit without keeping its activations for
// backward, and run it again (with gradients) when backward needs them,
// trading compute for memory. Combines with FullyShardedModule: the unit's
// parameters are gathered again before the recomputation.
//
//   std::vector<at::Tensor> out = CheckpointedForward(
//       [&](const std::vector<at::Tensor>& in) { return
//       std::vector<at::Tensor>{block->forward(in[0])}; }, {hidden});
//
// `fn` must be deterministic and use as tensor inputs only what it is given
// (tensors it captures get no gradient). Its parameters get their
// gradients even when no input needs one (a LoRA model's first block,
// whose frozen embedders hand it inputs without gradient).
//
// Thread-safety: as the autograd engine: call from the training thread.
#ifndef DRAY_RUNTIME_SHARDING_ACTIVATION_CHECKPOINT_H_
#define DRAY_RUNTIME_SHARDING_ACTIVATION_CHECKPOINT_H_

#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace dray {

using UnitFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

std::vector<at::Tensor> CheckpointedForward(UnitFunction fn, const std::vector<at::Tensor>& inputs);

}  // namespace dray

#endif  // DRAY_RUNTIME_SHARDING_ACTIVATION_CHECKPOINT_H_
