// The single-rank speed of one edit on this CPU, part of `dray bench --suite
// edit`: how close attention comes to the machine's matrix multiply, one
// denoising step and the VAE at the sizes people edit at.
//   matmul_gflops                 at::mm of two 2048 x 2048 float32 matrices
//   attention_gflops              DotProductAttention at a 1024 x 1024 edit's
//                                 token count (two images of 64 x 64 tokens and
//                                 256 of text), 2 heads of 128, float32, no grad
//   attention_matmul_share        the second over the first (aim: >= 0.6)
//   attention_fused_matmul_share  the same for at::scaled_dot_product_attention
//                                 (LibTorch 2 only)
//   attention_training_slowdown   the same attention computed for autograd
//                                 (blockwise, out of place) over the inference one
//   step_ms_256, _512, _1024      one guided denoising step (a batch of 2) of the
//                                 embedded transformer at the token counts of a
//                                 256, 512 and 1024 pixel square edit (not 1024
//                                 with --quick)
//   vae_encode_ms_256, _512       one image into latents by the embedded VAE
//   vae_decode_ms_256, _512       and latents back into one image
#ifndef DRAY_WORKERS_BENCH_ATTENTION_BENCH_H_
#define DRAY_WORKERS_BENCH_ATTENTION_BENCH_H_

#include <vector>

#include "absl/status/statusor.h"
#include "runtime/bench/bench_metric.h"

namespace dray {

absl::StatusOr<std::vector<BenchMetric>> RunAttentionBench(bool quick, const BenchReporter& report);

}  // namespace dray

#endif  // DRAY_WORKERS_BENCH_ATTENTION_BENCH_H_
