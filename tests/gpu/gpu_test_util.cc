#include "tests/gpu/gpu_test_util.h"

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/cuda_devices.h"
#include "base/files.h"
#include "workers/image/image_codec.h"
#include "workers/models/qwen_image/model.h"

namespace dray {
namespace {

// Scratch: this binary's scratch directory, removed at exit.
const ScratchDir& Scratch() {
  static const ScratchDir dir = ScratchDir::Create("dray-gpu-test").value();
  return dir;
}

}  // namespace

void CudaTest::SetUp() {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device: torch::cuda::is_available() is false; "
                 << DescribeCudaDevices().summary
                 << ". This test runs on a GPU machine, built against a CUDA LibTorch with NCCL";
  }
}

const std::string& SmallModelDir() {
  static const std::string dir = [] {
    const std::string path = Scratch().path() + "/small";
    const absl::Status written = qwen_image::WriteRandomQwenImageModel(
        path, qwen_image::PresetNamed("small").value(), /*seed=*/0);
    // Tests that load it then fail naming the missing files.
    EXPECT_TRUE(written.ok()) << "writing the small preset to " << path << ": " << written;
    return path;
  }();
  return dir;
}

std::string SetLoneRankEnvironment() {
  static int groups = 0;
  const std::string store = absl::StrCat(Scratch().path(), "/store-", groups++);
  for (const auto& [name, value] : {std::pair<const char*, std::string>{"RANK", "0"},
                                    {"WORLD_SIZE", "1"},
                                    {"LOCAL_RANK", "0"},
                                    {"LOCAL_WORLD_SIZE", "1"},
                                    {"DRAY_STORE_FILE", store}}) {
    setenv(name, value.c_str(), /*overwrite=*/1);
  }
  return store;
}

absl::StatusOr<std::unique_ptr<Communicator>> LoneNcclCommunicator(const std::string& name) {
  GroupAddress address;
  address.store_file = SetLoneRankEnvironment();
  absl::StatusOr<std::shared_ptr<Rendezvous>> rendezvous = Rendezvous::Join(address);
  if (!rendezvous.ok()) return rendezvous.status();
  return CreateNcclCommunicator(*std::move(rendezvous), name, /*device=*/0);
}

double RelativeError(const at::Tensor& actual, const at::Tensor& expected) {
  EXPECT_EQ(actual.sizes(), expected.sizes());
  const at::Tensor a = actual.detach().to(at::kCPU, at::kDouble);
  const at::Tensor e = expected.detach().to(at::kCPU, at::kDouble);
  return (a - e).norm().item<double>() / std::max(e.norm().item<double>(), 1e-300);
}

void ExpectErrorWithin(const std::string& what, double error, double tolerance) {
  const std::string measured = absl::StrCat(error, " (tolerance ", tolerance, ")");
  ::testing::Test::RecordProperty(what, measured);
  std::cout << "  " << what << ": " << measured << std::endl;
  EXPECT_LE(error, tolerance) << what;
}

double ImageError(const at::Tensor& actual, const at::Tensor& expected) {
  EXPECT_EQ(actual.sizes(), expected.sizes());
  const at::Tensor a = actual.to(at::kCPU, at::kDouble);
  const at::Tensor e = expected.to(at::kCPU, at::kDouble);
  const double rounding = std::sqrt(static_cast<double>(e.numel()));
  const double apart = std::max((a - e).norm().item<double>() - rounding, 0.0);
  return apart / std::max((e - 127.5).norm().item<double>(), 1e-300);
}

at::Tensor TestImage(int64_t height, int64_t width, int64_t salt) {
  const at::Tensor y = at::arange(height, at::kLong).view({height, 1, 1});
  const at::Tensor x = at::arange(width, at::kLong).view({1, width, 1});
  const at::Tensor channel = at::arange(3, at::kLong).view({1, 1, 3});
  return (x * 255 / width + y * (7 * salt + 5) + channel * 60 + salt * 40)
      .remainder(256)
      .to(at::kByte);
}

std::string TestPng(int64_t height, int64_t width, int64_t salt) {
  absl::StatusOr<std::string> png = EncodePng(TestImage(height, width, salt));
  EXPECT_TRUE(png.ok()) << png.status();
  return png.value_or("");
}

bool AllFinite(const at::Tensor& tensor) {
  return tensor.numel() == 0 || at::isfinite(tensor.detach()).all().item<bool>();
}

int64_t CudaBytes(const std::vector<at::Tensor>& tensors) {
  std::set<const c10::StorageImpl*> counted;
  int64_t bytes = 0;
  for (const at::Tensor& tensor : tensors) {
    if (!tensor.defined() || !tensor.is_cuda()) continue;
    if (counted.insert(tensor.storage().unsafeGetStorageImpl()).second)
      bytes += static_cast<int64_t>(tensor.storage().nbytes());
  }
  return bytes;
}

}  // namespace dray
