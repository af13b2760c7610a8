// The NCCL communicator (runtime/collectives/nccl_communicator.cc) on one
// GPU: a group of world size 1, the only NCCL group one device allows (NCCL
// refuses two ranks on the same GPU). Every collective of the Communicator
// interface runs on device memory for each dtype NCCL takes and must leave
// exactly the input (the sum, minimum or maximum over one rank, its part of
// a gather or a scatter). The inputs are computed by LibTorch just before,
// on its stream, and results read just after: a collective that did not
// wait for the work queued before it, or returned before finishing, reads
// or leaves stale memory. Tensors NCCL cannot take are INVALID_ARGUMENT.
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/collectives/communicator.h"
#include "runtime/worker/worker.h"
#include "tests/gpu/gpu_test_util.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::HasSubstr;

using NcclCommunicatorTest = CudaTest;

// kElements: large enough (16 Mi) that LibTorch's kernels producing an
// input are still running when the collective is enqueued.
constexpr int64_t kElements = int64_t{1} << 24;

// Source: kElements values of `dtype` on the GPU, a different pattern for
// each `salt`, computed by a few kernels on LibTorch's stream.
at::Tensor Source(at::ScalarType dtype, int64_t salt) {
  const at::Tensor index =
      at::arange(kElements, at::TensorOptions().device(kCuda).dtype(at::kLong));
  const at::Tensor values = (index * (2 * salt + 3) + salt).remainder(dtype == at::kBool ? 2 : 97);
  return values.to(dtype);
}

TEST_F(NcclCommunicatorTest, EveryCollectiveLeavesTheLoneRanksDataForEveryDtype) {
  DRAY_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> nccl, LoneNcclCommunicator("dtypes"));
  EXPECT_EQ(nccl->rank(), 0);
  EXPECT_EQ(nccl->world_size(), 1);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble, at::kLong,
                               at::kInt, at::kChar, at::kByte, at::kBool}) {
    SCOPED_TRACE(c10::toString(dtype));
    int64_t salt = 0;
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
      at::Tensor tensor = Source(dtype, ++salt);
      const void* data = tensor.data_ptr();
      DRAY_ASSERT_OK(nccl->AllReduce(tensor, op));
      EXPECT_EQ(tensor.data_ptr(), data) << "all_reduce is in place";
      EXPECT_TRUE(at::equal(tensor.cpu(), Source(dtype, salt).cpu()))
          << "all_reduce op " << static_cast<int>(op);
    }
    at::Tensor broadcast = Source(dtype, ++salt);
    DRAY_ASSERT_OK(nccl->Broadcast(broadcast, /*root=*/0));
    EXPECT_TRUE(at::equal(broadcast.cpu(), Source(dtype, salt).cpu())) << "broadcast";

    // Into a separate, zeroed output: a copy made before the input was
    // computed, or not finished when the call returned, shows here.
    const at::Tensor gathered_input = Source(dtype, ++salt);
    at::Tensor gathered = at::zeros_like(gathered_input);
    DRAY_ASSERT_OK(nccl->AllGather(gathered_input, gathered));
    EXPECT_TRUE(at::equal(gathered.cpu(), Source(dtype, salt).cpu())) << "all_gather";

    const at::Tensor scattered_input = Source(dtype, ++salt);
    at::Tensor scattered = at::zeros_like(scattered_input);
    DRAY_ASSERT_OK(nccl->ReduceScatter(scattered_input, scattered));
    EXPECT_TRUE(at::equal(scattered.cpu(), Source(dtype, salt).cpu())) << "reduce_scatter";

    const at::Tensor exchanged_input = Source(dtype, ++salt);
    at::Tensor exchanged = at::zeros_like(exchanged_input);
    DRAY_ASSERT_OK(nccl->AllToAll(exchanged_input, exchanged));
    EXPECT_TRUE(at::equal(exchanged.cpu(), Source(dtype, salt).cpu())) << "all_to_all";
  }
  DRAY_EXPECT_OK(nccl->Barrier());
}

TEST_F(NcclCommunicatorTest, SubgroupsAreNcclGroupsToo) {
  DRAY_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> nccl, LoneNcclCommunicator("parent"));
  // Two groups of one name (two modules sharded over one communicator).
  for (int made = 0; made < 2; ++made) {
    DRAY_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> sub, nccl->Subgroup({0}, "shard"));
    EXPECT_EQ(sub->world_size(), 1);
    at::Tensor tensor = Source(at::kFloat, made);
    DRAY_ASSERT_OK(sub->AllReduce(tensor));
    EXPECT_TRUE(at::equal(tensor.cpu(), Source(at::kFloat, made).cpu()));
    at::Tensor on_cpu = at::ones({4});
    EXPECT_THAT(sub->AllReduce(on_cpu), StatusIs(absl::StatusCode::kInvalidArgument));
  }
}

TEST_F(NcclCommunicatorTest, RefusesWhatNcclCannotTake) {
  DRAY_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> nccl, LoneNcclCommunicator("refusals"));
  const auto refused = [](absl::string_view message) {
    return StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(std::string(message)));
  };
  at::Tensor on_cpu = at::ones({8});
  EXPECT_THAT(nccl->AllReduce(on_cpu), refused("NCCL needs a contiguous CUDA tensor on device 0"));
  at::Tensor strided = at::ones({8, 8}, at::TensorOptions().device(kCuda)).t();
  EXPECT_THAT(nccl->Broadcast(strided, 0), refused("contiguous CUDA tensor"));
  at::Tensor undefined;
  EXPECT_THAT(nccl->AllReduce(undefined), refused("contiguous CUDA tensor"));
  at::Tensor complex = at::ones({8}, at::TensorOptions().device(kCuda).dtype(at::kComplexFloat));
  EXPECT_THAT(nccl->AllReduce(complex), refused("NCCL cannot reduce tensors of ComplexFloat"));
  at::Tensor values = at::ones({8}, at::TensorOptions().device(kCuda));
  EXPECT_THAT(nccl->Broadcast(values, /*root=*/1), StatusIs(absl::StatusCode::kInvalidArgument));
  at::Tensor too_small = at::empty({4}, values.options());
  EXPECT_THAT(nccl->AllGather(values, too_small), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(nccl->ReduceScatter(too_small, values), StatusIs(absl::StatusCode::kInvalidArgument));
  at::Tensor other_dtype = at::empty({8}, values.options().dtype(at::kDouble));
  EXPECT_THAT(nccl->AllGather(values, other_dtype), StatusIs(absl::StatusCode::kInvalidArgument));
  // Refusals leave the communicator usable.
  DRAY_ASSERT_OK(nccl->AllReduce(values));
  EXPECT_TRUE(at::equal(values.cpu(), at::ones({8})));
}

// A worker's device_comm() (what sharded models on a GPU use) is this NCCL
// group; its comm() stays Gloo, on CPU tensors.
TEST_F(NcclCommunicatorTest, AWorkersDeviceCommunicatorIsNccl) {
  std::unique_ptr<Worker> worker = LoneWorker<Worker>();
  DRAY_ASSERT_OK_AND_ASSIGN(Communicator * device, worker->device_comm());
  EXPECT_EQ(device->world_size(), 1);
  at::Tensor on_gpu = Source(at::kBFloat16, 5);
  DRAY_ASSERT_OK(device->AllReduce(on_gpu));
  EXPECT_TRUE(at::equal(on_gpu.cpu(), Source(at::kBFloat16, 5).cpu()));
  at::Tensor on_cpu = at::ones({8});
  EXPECT_THAT(device->AllReduce(on_cpu), StatusIs(absl::StatusCode::kInvalidArgument));
  DRAY_ASSERT_OK_AND_ASSIGN(Communicator * host, worker->comm());
  DRAY_EXPECT_OK(host->AllReduce(on_cpu));
  DRAY_EXPECT_OK(device->Barrier());
}

}  // namespace
}  // namespace dray
