// The sharding benchmark, run by `dray bench --suite sharding`: per-rank
// memory of a FULL_SHARD Qwen-Image transformer (the small preset, deeper)
// at world sizes 1, 2 and 4 (Gloo ranks as threads), against the ideal, and
// the train-step time against the unsharded model, all in one run:
//   shard_param_bytes_w{W}      peak parameter bytes on a rank during a step
//   shard_ideal_bytes_w{W}      total parameter bytes / W + the largest unit
//   shard_grad_bytes_w{W}       gradient bytes on a rank after backward
//   shard_optimizer_bytes_w{W}  AdamW state bytes on a rank
//   shard_step_ratio_w{W}       step time (forward, backward, AdamW) / unsharded
// and DMD2's three models on a rank (algorithm.name dmd2 with full
// fine-tuning, each FULL_SHARD), after a step of each trained one:
//   dmd2_generator_bytes_w{W}, dmd2_fake_score_bytes_w{W}   masters, gradients, AdamW
//   dmd2_real_score_bytes_w{W}  frozen, stored in bfloat16
//   dmd2_predicted_bytes_w{W}   (16 + 2 + 16) (B / W + R) from the parameter counts:
//                               B in the blocks (sharded), R outside them (replicated)
//   dmd2_measured_over_predicted_w{W}
#ifndef DRAY_WORKERS_BENCH_SHARDING_BENCH_H_
#define DRAY_WORKERS_BENCH_SHARDING_BENCH_H_

#include <vector>

#include "absl/status/statusor.h"
#include "runtime/bench/bench_metric.h"

namespace dray {

absl::StatusOr<std::vector<BenchMetric>> RunShardingBench(bool quick, const BenchReporter& report);

}  // namespace dray

#endif  // DRAY_WORKERS_BENCH_SHARDING_BENCH_H_
