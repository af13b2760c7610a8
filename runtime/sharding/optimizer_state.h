// AdamW's state in training checkpoints: the first and second moments of a
// FullyShardedModule's shards, sharded like them (each rank writes the part
// it keeps; any world size reloads it), and the step count.
//
//   DRAY_RETURN_IF_ERROR(sharded->SaveShardedLike(dir, "model", sharded->shards()));
//   DRAY_RETURN_IF_ERROR(SaveAdamWState(*sharded, optimizer, dir));
//   ... later, at any world size ...
//   DRAY_RETURN_IF_ERROR(sharded->LoadShardedLike(dir, "model", sharded->shards()));
//   DRAY_RETURN_IF_ERROR(LoadAdamWState(*sharded, optimizer, dir));
//
// The optimizer must be over exactly `module.shards()`, in that order. All
// ranks call both functions (they are collective).
#ifndef DRAY_RUNTIME_SHARDING_OPTIMIZER_STATE_H_
#define DRAY_RUNTIME_SHARDING_OPTIMIZER_STATE_H_

#include <string>

#include <torch/optim/adamw.h>

#include "absl/status/status.h"
#include "runtime/sharding/fully_sharded.h"

namespace dray {

// SaveAdamWState writes `dir`/adamw_exp_avg-*, adamw_exp_avg_sq-* and
// adamw.json (the step). Before the first step the moments are zero.
absl::Status SaveAdamWState(FullyShardedModule& module, torch::optim::AdamW& optimizer,
                            const std::string& dir);

// LoadAdamWState restores what SaveAdamWState wrote, replacing the
// optimizer's state (hyperparameters stay as configured).
absl::Status LoadAdamWState(FullyShardedModule& module, torch::optim::AdamW& optimizer,
                            const std::string& dir);

}  // namespace dray

#endif  // DRAY_RUNTIME_SHARDING_OPTIMIZER_STATE_H_
