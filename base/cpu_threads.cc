#include "base/cpu_threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

namespace dray {

void UseOneCpuThreadPerCaller() {
  at::set_num_threads(1);
  // OpenBLAS is found by its symbol, so that a LibTorch on another BLAS
  // (MKL, which at::set_num_threads does set) needs nothing more.
  using SetThreads = void (*)(int);
  static const auto openblas_set_num_threads =
      reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (openblas_set_num_threads != nullptr) openblas_set_num_threads(1);
}

}  // namespace dray
