// base/cuda_devices.h in a build without CUDA (the default).
#include "base/cuda_devices.h"

namespace dray {

CudaDevices DescribeCudaDevices() {
  CudaDevices cuda;
  cuda.summary = "CUDA: not compiled (a CPU build)";
  return cuda;
}

int64_t CudaPeakAllocatedBytes(int) { return 0; }

void ResetCudaPeakAllocated(int) {}

int64_t CudaAllocatedBytes(int) { return 0; }

}  // namespace dray
