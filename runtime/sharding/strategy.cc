#include "runtime/sharding/strategy.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace dray {
namespace {

struct Named {
  ShardingStrategy strategy;
  const char* name;
};

constexpr Named kStrategies[] = {
    {ShardingStrategy::kFullShard, "FULL_SHARD"},
    {ShardingStrategy::kShardGradOp, "SHARD_GRAD_OP"},
    {ShardingStrategy::kNoShard, "NO_SHARD"},
    {ShardingStrategy::kHybridShard, "HYBRID_SHARD"},
    {ShardingStrategy::kHybridShardZero2, "HYBRID_SHARD_ZERO2"},
};

}  // namespace

absl::StatusOr<ShardingStrategy> ParseShardingStrategy(absl::string_view text) {
  const std::string upper = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(text));
  for (const Named& named : kStrategies) {
    if (upper == named.name || upper == absl::StrCat(static_cast<int>(named.strategy)))
      return named.strategy;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown sharding strategy '", text,
                   "'; valid: FULL_SHARD (1), SHARD_GRAD_OP (2), NO_SHARD (3), HYBRID_SHARD (4), "
                   "HYBRID_SHARD_ZERO2 (5)"));
}

absl::string_view ShardingStrategyName(ShardingStrategy strategy) {
  for (const Named& named : kStrategies) {
    if (named.strategy == strategy) return named.name;
  }
  return "UNKNOWN";
}

}  // namespace dray
