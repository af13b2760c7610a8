// How a fully sharded module spreads its parameters over the ranks: the
// strategies of PyTorch FSDP, under the names and numbers that accelerate
// configs use (fsdp_sharding_strategy: FULL_SHARD or 1, ...).
#ifndef DRAY_RUNTIME_SHARDING_STRATEGY_H_
#define DRAY_RUNTIME_SHARDING_STRATEGY_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dray {

enum class ShardingStrategy {
  kFullShard = 1,         // parameters, gradients, optimizer state sharded; regathered for backward
  kShardGradOp = 2,       // as FULL_SHARD, but parameters stay gathered from forward to backward
  kNoShard = 3,           // replicated (DDP): gradients all-reduced
  kHybridShard = 4,       // FULL_SHARD within a node group, replicated across groups
  kHybridShardZero2 = 5,  // SHARD_GRAD_OP within a node group, replicated across groups
};

// ParseShardingStrategy accepts "FULL_SHARD", "full_shard", "1", ...; anything
// else is INVALID_ARGUMENT listing the valid values.
absl::StatusOr<ShardingStrategy> ParseShardingStrategy(absl::string_view text);

absl::string_view ShardingStrategyName(ShardingStrategy strategy);

// ShardsParameters: every strategy but NO_SHARD splits parameters over ranks.
inline bool ShardsParameters(ShardingStrategy strategy) {
  return strategy != ShardingStrategy::kNoShard;
}

// IsHybrid: sharded within a node group, replicated across groups.
inline bool IsHybrid(ShardingStrategy strategy) {
  return strategy == ShardingStrategy::kHybridShard ||
         strategy == ShardingStrategy::kHybridShardZero2;
}

// ReshardsAfterForward: FULL_SHARD and HYBRID_SHARD free gathered units
// after forward and gather them again for backward; the ZERO2-like
// strategies keep them gathered until backward.
inline bool ReshardsAfterForward(ShardingStrategy strategy) {
  return strategy == ShardingStrategy::kFullShard || strategy == ShardingStrategy::kHybridShard;
}

}  // namespace dray

#endif  // DRAY_RUNTIME_SHARDING_STRATEGY_H_
