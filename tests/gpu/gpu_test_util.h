// Shared pieces of the GPU tests: the skip when no CUDA device is visible, a
// lone rank (world size 1) of a worker group in this process, the small
// model preset, test images, bfloat16 tolerances, and what lives on the
// device.
//
// Every GPU test derives its fixture from CudaTest, so that on a machine or
// a LibTorch without CUDA (this repository's default build) it is skipped,
// saying why, instead of passing on nothing:
//
//   using NcclCommunicatorTest = CudaTest;
//   TEST_F(NcclCommunicatorTest, AllReduce) {
//     DRAY_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> nccl, LoneNcclCommunicator("x"));
//     ...
//   }
//
// The tests run here (skipping) from Bazel and on a GPU machine from the
// CMake build (CMakeLists.txt), which compiles tests/gpu/*.cc into one
// binary against dray's libraries alone: these tests use no other test
// package's helpers, and nothing here reads Bazel's environment.
//
// Thread-safety: these helpers change the process's environment
// (LoneWorker); call them from the test's thread.
#ifndef DRAY_TESTS_GPU_GPU_TEST_UTIL_H_
#define DRAY_TESTS_GPU_GPU_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "runtime/collectives/communicator.h"

namespace dray {

// CudaTest skips every test of a fixture derived from it when
// torch::cuda::is_available() is false.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override;
};

// kCuda: the device the tests run on (the worker classes use device 0: the
// controller makes a worker's own GPU its only visible one).
inline const at::Device kCuda(at::kCUDA, 0);

// SmallModelDir writes the "small" preset (`dray init-model --preset small`:
// the real layout at reduced width, random weights, seed 0) once per test
// binary, into a scratch directory removed at exit, and returns its path.
const std::string& SmallModelDir();

// SetLoneRankEnvironment makes the workers built after it a lone rank
// (RANK 0 of WORLD_SIZE 1) whose group meets through a fresh store file, as
// the controller would set up one worker process; returns that file.
std::string SetLoneRankEnvironment();

// LoneWorker builds worker class T as that lone rank, in this process: its
// comm() is Gloo and its device_comm() NCCL on device 0, both of world size 1.
template <typename T>
std::unique_ptr<T> LoneWorker() {
  SetLoneRankEnvironment();
  return std::make_unique<T>();
}

// LoneNcclCommunicator joins an NCCL group of world size 1 on device 0,
// called `name`, through a fresh store file.
absl::StatusOr<std::unique_ptr<Communicator>> LoneNcclCommunicator(const std::string& name);

// Bfloat16 tolerances. bfloat16 keeps 8 significant bits, so rounding a
// value to it errs by at most kBfloat16UnitRoundoff = 2^-8 of the value;
// over many values that error is spread evenly in [-u, u]: RMS u / sqrt(3).
// On a GPU, matrix products and convolutions accumulate in float32, so
// what differs from float32 is the rounding of every operation's output
// (and of the weights) to bfloat16. A result that passed through
// `roundings` such roundings (each layer's output, each norm, each
// activation, each residual sum along the longest path) carries their
// errors, independent and passed on with a gain of about one by the
// normalized layers, so summed in quadrature: sqrt(roundings) * u / sqrt(3)
// relative RMS error. Bfloat16Tolerance allows twice that, compared as
// RelativeError (an RMS measure: elementwise relative errors are unbounded
// where values cross zero).
inline constexpr double kBfloat16UnitRoundoff = 1.0 / 256;
inline double Bfloat16Tolerance(int roundings) {
  return 2 * std::sqrt(static_cast<double>(roundings)) * kBfloat16UnitRoundoff / std::sqrt(3.0);
}

// Roundings along the longest path through each model of the small preset,
// counted from the code (workers/models/qwen_image, workers/models/qwen2_vl)
// and rounded up to the next multiple of 32: what Bfloat16Tolerance takes.
// Text encoder: vision tower (patch embedding, 2 blocks of ~14 operations,
// merger) then 2 decoder layers of ~14: ~63.
inline constexpr int kTextEncoderRoundings = 64;
// Transformer: input projections and timestep MLP (~5), 3 dual-stream
// blocks of ~18 (modulated norms, projections, QK norms, RoPE, attention,
// gated residuals, MLP), output norm and projection (~3): ~62.
inline constexpr int kTransformerRoundings = 64;
// VAE encoder: 4 levels of 2 residual blocks (norm, SiLU, conv, twice, and
// the sum: ~7 each) and a downsampling conv, the middle blocks and
// attention (~20), head and quantization conv: ~85.
inline constexpr int kVaeEncoderRoundings = 96;
// VAE decoder: the middle (~20), 4 levels of 3 residual blocks and an
// upsampling conv (~22 each), head: ~112.
inline constexpr int kVaeDecoderRoundings = 128;

// RelativeError: ||actual - expected|| / ||expected|| (L2 over all
// elements, in float64 on the CPU). The shapes must agree.
double RelativeError(const at::Tensor& actual, const at::Tensor& expected);

// ExpectErrorWithin expects `error` (a RelativeError or ImageError) to be
// at most `tolerance`, and records both as the test's property `what` (in
// --gtest_output's XML and on stdout): the margins a GPU run measured.
void ExpectErrorWithin(const std::string& what, double error, double tolerance);

// ImageError: the same for uint8 images, around mid-grey (127.5, the
// decoder's zero), less the rounding to whole levels: each pixel of each
// image was rounded by at most half a level, so two images of the same
// float values may differ by one level per pixel, sqrt(pixels) in L2.
double ImageError(const at::Tensor& actual, const at::Tensor& expected);

// TestImage: an RGB uint8 [height, width, 3] image of ramps, another for
// each `salt`; TestPng: the same as PNG, as edit batches carry images.
at::Tensor TestImage(int64_t height, int64_t width, int64_t salt);
std::string TestPng(int64_t height, int64_t width, int64_t salt);

// AllFinite: no element of `tensor` is NaN or infinite.
bool AllFinite(const at::Tensor& tensor);

// CudaBytes: the bytes of CUDA memory that `tensors` hold, each storage
// counted once (views of one buffer share it; a released storage holds
// none). LibTorch's C++ API has no allocator statistics without the CUDA
// headers (c10::cuda::CUDACachingAllocator), so device memory is measured
// as the storages the tensors own: what the caching allocator counts as
// allocated for them, but for its rounding up to 512-byte blocks.
int64_t CudaBytes(const std::vector<at::Tensor>& tensors);

}  // namespace dray

#endif  // DRAY_TESTS_GPU_GPU_TEST_UTIL_H_
