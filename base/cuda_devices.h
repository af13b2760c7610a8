// What this dray can run on: whether it was built with CUDA (the CUDA
// runtime and NCCL linked: Bazel's --config=cuda, or the CMake build against
// a CUDA LibTorch) and which CUDA devices the process sees. For
// `dray --version`, for benchmarks and for tests that need a GPU.
//
//   CudaDevices cuda = DescribeCudaDevices();
//   if (cuda.devices.empty()) GTEST_SKIP() << "no CUDA device: " << cuda.summary;
//
// Thread-safe.
#ifndef DRAY_BASE_CUDA_DEVICES_H_
#define DRAY_BASE_CUDA_DEVICES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace dray {

// CudaDevice: one device as the CUDA runtime describes it.
struct CudaDevice {
  std::string name;            // e.g. "NVIDIA H100 80GB HBM3"
  int compute_capability = 0;  // major * 10 + minor: 90 for sm_90
  int64_t memory_bytes = 0;
  int multiprocessors = 0;
};

// CudaDevices: the build's CUDA support and the devices it sees.
struct CudaDevices {
  bool compiled = false;        // built with the CUDA runtime and NCCL
  std::string runtime_version;  // "13.0"; empty where !compiled
  std::string nccl_version;     // "2.27.3"; empty where !compiled
  std::vector<CudaDevice> devices;
  // summary: one line, e.g. "CUDA: compiled (runtime 13.0, NCCL 2.27.3), 1
  // device: cuda:0 NVIDIA H100 80GB HBM3 (sm_90, 79.2 GiB, 132 SMs)",
  // "CUDA: compiled (runtime 12.4, NCCL 2.21.5), no device (no CUDA-capable
  // device is detected)" or "CUDA: not compiled (a CPU build)".
  std::string summary;
};

// DescribeCudaDevices: asks the CUDA runtime (never fails: a missing driver
// or device is reported in `summary`).
CudaDevices DescribeCudaDevices();

// CudaPeakAllocatedBytes: the most memory LibTorch's CUDA allocator has had
// allocated on `device` since the process started or the last
// ResetCudaPeakAllocated(device), as torch.cuda.max_memory_allocated()
// reports it; 0 in a build without CUDA.
int64_t CudaPeakAllocatedBytes(int device);
void ResetCudaPeakAllocated(int device);

// CudaAllocatedBytes: what LibTorch's CUDA allocator has allocated on
// `device` now, as torch.cuda.memory_allocated(); 0 in a build without CUDA
// or without that device.
int64_t CudaAllocatedBytes(int device);

}  // namespace dray

#endif  // DRAY_BASE_CUDA_DEVICES_H_
