// FullyShardedModule's internal pieces, shared by its translation units
// (fully_sharded.cc: sharding, hooks, gradients; fully_sharded_state_dict.cc:
// state dicts). Not part of the API.
#ifndef DRAY_RUNTIME_SHARDING_FULLY_SHARDED_UNIT_H_
#define DRAY_RUNTIME_SHARDING_FULLY_SHARDED_UNIT_H_

#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/autograd/function.h>

#include "runtime/sharding/fully_sharded.h"

namespace dray {

// Unit: one flat parameter: a unit's trainable parameters, or its frozen
// ones (each unit of modules has one or both). Its module parameters are
// views into `full`, whose storage is allocated only while the unit is
// gathered, so that views autograd saved for backward stay valid across a
// free and a re-gather.
struct FullyShardedModule::Unit {
  // Trainable: a float32 master shard with gradients. Frozen (FSDP's
  // use_orig_params with requires_grad=False): a shard in the compute
  // dtype, never reduced nor seen by the optimizer.
  bool trainable = true;
  // A trainable unit whose modules have no frozen parameters is freed once
  // its gradients are in; with frozen parameters (needed for the input
  // gradients) only when backward moves to an earlier unit.
  bool free_after_gradients = true;
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  std::vector<int64_t> offsets;
  int64_t padded = 0;  // flat size, a multiple of the shard group
  at::Tensor shard;    // this rank's part: the optimizer's float32 master when trainable
  at::Tensor full;     // [padded], storage freed while resharded
  bool gathered = false;
  int pending_gradients = 0;  // parameters still to accumulate in this backward
  bool gradients_reduced = true;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // keep post-hooks alive
};

}  // namespace dray

#endif  // DRAY_RUNTIME_SHARDING_FULLY_SHARDED_UNIT_H_
