// Replicated modules: the part of a model every rank holds whole (a VAE
// beside a sharded transformer, or a whole model without sharding).
//
//   // Rank 0 loaded the weights; the others built the module shape-only.
//   DRAY_RETURN_IF_ERROR(BroadcastModule(*vae, comm));
#ifndef DRAY_RUNTIME_SHARDING_REPLICATE_H_
#define DRAY_RUNTIME_SHARDING_REPLICATE_H_

#include <cstdint>

#include <torch/nn/module.h>

#include "absl/status/status.h"
#include "runtime/collectives/communicator.h"

namespace dray {

// BroadcastModule gives every rank `root`'s parameters and buffers
// (FSDP's and DDP's sync_module_states). Shape-only tensors get memory
// first. Every rank calls it, with modules of the same structure.
absl::Status BroadcastModule(torch::nn::Module& module, Communicator* comm, int root = 0);

// ModuleBytes: the bytes of `module`'s parameters that hold memory.
int64_t ModuleBytes(const torch::nn::Module& module);

}  // namespace dray

#endif  // DRAY_RUNTIME_SHARDING_REPLICATE_H_
