// Whether LibTorch computes in bfloat16 on this CPU (torch_dtype bfloat16 on
// device cpu), asked before a job starts rather than learnt from a worker's
// crash. Two things must hold: the CPU has AVX512-BF16, without which
// LibTorch 1.13's bfloat16 kernels die of an illegal instruction (so nothing
// is tried there; required of every LibTorch, though 2.x would emulate it
// slowly), and oneDNN, which LibTorch 1.13 multiplies and convolves
// bfloat16 with, accepts a bfloat16 matmul and convolution: it refuses both
// when its instruction set is capped, e.g. ONEDNN_MAX_CPU_ISA=SSE41 (2.6
// falls back to its own kernels there).
//
//   if (absl::Status bf16 = CpuBfloat16Support(); !bf16.ok()) return bf16;
//
// Thread-safe; probed once per process.
#ifndef DRAY_BASE_CPU_BFLOAT16_H_
#define DRAY_BASE_CPU_BFLOAT16_H_

#include "absl/status/status.h"

namespace dray {

// CpuBfloat16Support: OK, or FailedPrecondition saying what is missing.
absl::Status CpuBfloat16Support();

}  // namespace dray

#endif  // DRAY_BASE_CPU_BFLOAT16_H_
