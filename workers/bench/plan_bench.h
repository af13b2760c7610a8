// The memory plan checked against measured peaks, run by `dray bench
// --suite plan`: real training steps (forward, backward, gradient
// clipping, AdamW) of a small FLUX.1 transformer (flux-tiny widened: 2
// dual- and 4 single-stream blocks, width 128, 4 heads) sharded by
// FullyShardedModule over Gloo ranks as threads, at a 256x256 Kontext edit
// (256 noisy + 256 condition image tokens, 64 text tokens), micro-batch 1.
// The step's peak of CPU tensor memory is counted at the allocator
// (runtime/bench/cpu_memory_counter.h) and set against PlanMemory's
// prediction for the same setup (Gloo; the attention kernel this LibTorch
// runs, blockwise on 1.13, fused on 2; no allocator slack, no CUDA context):
//   plan_ratio_<case>      measured / predicted peak of a rank
//   plan_measured_<case>   the measured peak of a rank, MiB
//   plan_predicted_<case>  the plan's, MiB
// Cases <case>: w{1,2}_{full_shard,shard_grad_op}_{lora,full}[_ckpt]_bf16
// (LoRA rank 8; _f32 where the CPU cannot compute bfloat16,
// base/cpu_bfloat16.h), and without --quick six more: float32 runs
// (NO_SHARD among them), micro-batch 2 (_mb2) and FULL_SHARD prefetching
// with limit_all_gathers 2 (_prefetch).
//
// Each rank thread is charged what it allocates, and 1/W of what Gloo's
// own threads allocate (its all-gather staging copies); the largest rank's
// peak is reported.
//
//   DRAY_ASSIGN_OR_RETURN(std::vector<PlanCheck> checks, RunPlanChecks(true, {}));
//
// Thread-safety: call from one thread at a time (it installs the counter
// and resets its peak).
#ifndef DRAY_WORKERS_BENCH_PLAN_BENCH_H_
#define DRAY_WORKERS_BENCH_PLAN_BENCH_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/bench/bench_metric.h"
#include "workers/train/memory_plan.h"

namespace dray {

// PlanCheck: one case, measured and predicted.
struct PlanCheck {
  std::string name;  // w2_full_shard_lora_ckpt_bf16
  PlanOptions options;
  int64_t lora_rank = 0;
  int64_t measured = 0;   // bytes, a rank's peak in a steady step
  int64_t predicted = 0;  // bytes, PlanMemory's total
  double ratio() const { return static_cast<double>(measured) / static_cast<double>(predicted); }
};

// RunPlanChecks runs the cases (`quick`: the bfloat16 grid only), calling
// `done` after each.
absl::StatusOr<std::vector<PlanCheck>> RunPlanChecks(
    bool quick, const std::function<void(const PlanCheck&)>& done);

absl::StatusOr<std::vector<BenchMetric>> RunPlanBench(bool quick, const BenchReporter& report);

}  // namespace dray

#endif  // DRAY_WORKERS_BENCH_PLAN_BENCH_H_
