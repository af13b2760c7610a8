// The transformer benchmark for GPUs, run by `dray bench --suite gpu`:
// Qwen-Image's MMDiT at the real model's sizes in bf16 on the first CUDA
// device. Without one (CI, a laptop) it measures the same figures at the
// small preset's sizes in float32 on the CPU, so that the suite always runs.
//
//   block_forward_ms, block_forward_tflops   one dual-stream block (24 heads x
//                                            128; text 3584 wide) on a
//                                            1024x1024 edit's tokens: 4096
//                                            target + 4096 condition image
//                                            tokens and 256 text tokens
//   block_forward_backward_ms, _tflops       forward and backward of the same
//   block_forward_peak_share, ...            TFLOP/s over the device's dense
//                                            bf16 peak, where dray knows it
//   block_forward_blockwise_ms               the blockwise attention kernel
//   fused_attention_speedup                  instead of the fused one, and the
//                                            ratio (LibTorch 2 only)
//   step_s                                   the whole transformer (60 blocks,
//                                            20.4B parameters, random weights):
//                                            one denoising step with CFG (a
//                                            batch of 2), where memory allows
//   step_peak_memory_gib                     the device's peak allocated
//                                            memory over it (CPU: the
//                                            process's peak resident memory)
//
// FLOPs count the matrix products (linear layers and attention), as
// 2 * multiply-adds; backward counts twice the forward's.
#ifndef DRAY_WORKERS_BENCH_GPU_BENCH_H_
#define DRAY_WORKERS_BENCH_GPU_BENCH_H_

#include <vector>

#include "absl/status/statusor.h"
#include "runtime/bench/bench_metric.h"

namespace dray {

struct GpuBenchOptions {
  bool quick = false;  // fewer repetitions
  BenchReporter report;
};

absl::StatusOr<std::vector<BenchMetric>> RunGpuBench(const GpuBenchOptions& options);

}  // namespace dray

#endif  // DRAY_WORKERS_BENCH_GPU_BENCH_H_
