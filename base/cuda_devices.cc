// base/cuda_devices.h in a CUDA build: the CUDA runtime and NCCL directly,
// so that it reports the same whichever LibTorch dray was built against,
// and LibTorch's CUDA allocator for its memory figures.
#include "base/cuda_devices.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <exception>
#include <string>

namespace dray {
namespace {

// CudaVersionString: 13000 -> "13.0" (CUDA's major * 1000 + minor * 10).
std::string CudaVersionString(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// NcclVersionString: NCCL_VERSION_CODE's layout, major * 10000 + minor * 100
// + patch (NCCL 2.9 and later).
std::string NcclVersionString(int version) {
  return std::to_string(version / 10000) + "." + std::to_string(version % 10000 / 100) + "." +
         std::to_string(version % 100);
}

std::string DeviceLine(int index, const CudaDevice& device) {
  char line[256];
  std::snprintf(line, sizeof(line), "cuda:%d %s (sm_%d, %.1f GiB, %d SMs)", index,
                device.name.c_str(), device.compute_capability,
                static_cast<double>(device.memory_bytes) / (1 << 30), device.multiprocessors);
  return line;
}

}  // namespace

CudaDevices DescribeCudaDevices() {
  CudaDevices cuda;
  cuda.compiled = true;
  int runtime = 0, nccl = 0;
  cudaRuntimeGetVersion(&runtime);
  ncclGetVersion(&nccl);
  cuda.runtime_version = CudaVersionString(runtime);
  cuda.nccl_version = NcclVersionString(nccl);
  cuda.summary =
      "CUDA: compiled (runtime " + cuda.runtime_version + ", NCCL " + cuda.nccl_version + "), ";
  int count = 0;
  if (const cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess) {
    cudaGetLastError();  // clears it for whoever asks next
    cuda.summary += std::string("no device (") + cudaGetErrorString(error) + ")";
    return cuda;
  }
  for (int index = 0; index < count; ++index) {
    cudaDeviceProp properties{};
    if (cudaGetDeviceProperties(&properties, index) != cudaSuccess) continue;
    cuda.devices.push_back({properties.name, properties.major * 10 + properties.minor,
                            static_cast<int64_t>(properties.totalGlobalMem),
                            properties.multiProcessorCount});
  }
  if (cuda.devices.empty()) {
    cuda.summary += "no device";
    return cuda;
  }
  cuda.summary +=
      std::to_string(cuda.devices.size()) + (cuda.devices.size() == 1 ? " device: " : " devices: ");
  for (size_t i = 0; i < cuda.devices.size(); ++i) {
    cuda.summary += (i ? "; " : "") + DeviceLine(static_cast<int>(i), cuda.devices[i]);
  }
  return cuda;
}

int64_t CudaPeakAllocatedBytes(int device) {
  const auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  return stats.allocated_bytes[0].peak;  // [0]: StatType::AGGREGATE, every pool
}

void ResetCudaPeakAllocated(int device) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
}

int64_t CudaAllocatedBytes(int device) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || device >= devices) return 0;
  try {  // the allocator refuses a device before the process's first CUDA tensor
    const auto stats =
        c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
    return stats.allocated_bytes[0].current;
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace dray
