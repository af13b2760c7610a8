// Argument checks that every Communicator implementation makes the same way,
// before handing tensors to its backend. Each returns INVALID_ARGUMENT naming
// the collective; device and layout checks stay with each backend.
//
// Thread-safety: stateless functions.
#ifndef DRAY_RUNTIME_COLLECTIVES_COLLECTIVE_CHECKS_H_
#define DRAY_RUNTIME_COLLECTIVES_COLLECTIVE_CHECKS_H_

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dray {

// CheckRoot: `root` is a rank of a group of `world_size`.
absl::Status CheckRoot(absl::string_view collective, int root, int world_size);

// CheckParts: `whole` holds `world_size` parts the size and dtype of `part`
// (all_gather's output, reduce_scatter's input).
absl::Status CheckParts(absl::string_view collective, const at::Tensor& part,
                        const at::Tensor& whole, int world_size);

// CheckAllToAll: `input` and `output` of one dtype and size, `world_size`
// equal parts each.
absl::Status CheckAllToAll(const at::Tensor& input, const at::Tensor& output, int world_size);

}  // namespace dray

#endif  // DRAY_RUNTIME_COLLECTIVES_COLLECTIVE_CHECKS_H_
