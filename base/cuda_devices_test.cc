#include "base/cuda_devices.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dray {
namespace {

using ::testing::StartsWith;

TEST(CudaDevicesTest, TheSummarySaysHowDrayWasBuiltAndWhatItSees) {
  const CudaDevices cuda = DescribeCudaDevices();
  if (!cuda.compiled) {
    EXPECT_EQ(cuda.summary, "CUDA: not compiled (a CPU build)");
    EXPECT_TRUE(cuda.devices.empty());
    EXPECT_EQ(CudaPeakAllocatedBytes(0), 0);
    return;
  }
  EXPECT_THAT(cuda.summary, StartsWith("CUDA: compiled (runtime " + cuda.runtime_version +
                                       ", NCCL " + cuda.nccl_version + "), "));
  for (const CudaDevice& device : cuda.devices) {
    EXPECT_FALSE(device.name.empty());
    EXPECT_GE(device.compute_capability, 35);
    EXPECT_GT(device.memory_bytes, 0);
  }
}

}  // namespace
}  // namespace dray
