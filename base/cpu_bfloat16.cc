#include "base/cpu_bfloat16.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <exception>

#include "absl/strings/str_cat.h"
#include "base/exception_message.h"

namespace dray {
namespace {

absl::Status Probe() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bf16"))
    return absl::FailedPreconditionError("this CPU lacks AVX512-BF16");
  try {
    const at::TensorOptions bf16 = at::TensorOptions(at::kBFloat16);
    at::matmul(at::ones({64, 64}, bf16), at::ones({64, 64}, bf16));
    at::conv2d(at::ones({1, 4, 8, 8}, bf16), at::ones({4, 4, 3, 3}, bf16));
  } catch (const std::exception& e) {
    const char* onednn = std::getenv("ONEDNN_MAX_CPU_ISA");
    const char* dnnl = std::getenv("DNNL_MAX_CPU_ISA");
    return absl::FailedPreconditionError(absl::StrCat(
        "LibTorch's oneDNN refuses bfloat16 here (ONEDNN_MAX_CPU_ISA=", onednn ? onednn : "unset",
        ", DNNL_MAX_CPU_ISA=", dnnl ? dnnl : "unset", "): ", ExceptionMessage(e)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CpuBfloat16Support() {
  static const absl::Status* const support = new absl::Status(Probe());
  return *support;
}

}  // namespace dray
