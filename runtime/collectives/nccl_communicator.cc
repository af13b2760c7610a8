// Communicator over NCCL, for CUDA tensors; compiled only by --config=cuda.
//
// Written against NCCL and the CUDA runtime directly rather than LibTorch's
// ProcessGroupNCCL, so that it builds the same against LibTorch 1.13 and 2.x.
// Rank 0 creates the NCCL unique id and publishes it through the group's
// c10d store. Each collective runs on the communicator's own stream and
// waits for it, so a collective has finished when the call returns, as with
// Gloo.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/exception_message.h"
#include "base/status_macros.h"
#include "runtime/collectives/collective_checks.h"
#include "runtime/collectives/communicator.h"
#include "runtime/collectives/rendezvous_store.h"

namespace dray {
namespace {

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

absl::Status NcclStatus(ncclResult_t result, absl::string_view what) {
  if (result == ncclSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, ": ", ncclGetErrorString(result)));
}

absl::StatusOr<ncclDataType_t> NcclType(at::ScalarType type) {
  switch (type) {
    case at::kBool:
    case at::kByte:
      return ncclUint8;
    case at::kChar:
      return ncclInt8;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL cannot reduce tensors of ", c10::toString(type)));
  }
}

ncclRedOp_t NcclOp(ReduceOp op) {
  return op == ReduceOp::kSum ? ncclSum : op == ReduceOp::kMin ? ncclMin : ncclMax;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<Rendezvous> rendezvous, std::string name, std::vector<int> ranks,
                   ncclComm_t comm, cudaStream_t stream, int device)
      : rendezvous_(std::move(rendezvous)),
        name_(std::move(name)),
        ranks_(std::move(ranks)),
        comm_(comm),
        stream_(stream),
        device_(device) {}

  ~NcclCommunicator() override {
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override {
    return static_cast<int>(std::find(ranks_.begin(), ranks_.end(), rendezvous_->address().rank) -
                            ranks_.begin());
  }
  int world_size() const override { return static_cast<int>(ranks_.size()); }

  absl::StatusOr<std::unique_ptr<Communicator>> Subgroup(const std::vector<int>& ranks,
                                                         const std::string& name) override {
    std::vector<int> global;
    for (int rank : ranks) global.push_back(ranks_.at(rank));
    return CreateNcclCommunicator(rendezvous_, absl::StrCat(name_, "/", UniqueSubgroupName(name)),
                                  device_, global);
  }

  absl::Status AllReduce(at::Tensor& tensor, ReduceOp op) override {
    DRAY_RETURN_IF_ERROR(Check(tensor, "all_reduce"));
    DRAY_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(tensor.scalar_type()));
    return Run("all_reduce", ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                                           type, NcclOp(op), comm_, stream_));
  }

  absl::Status Broadcast(at::Tensor& tensor, int root) override {
    DRAY_RETURN_IF_ERROR(Check(tensor, "broadcast"));
    DRAY_RETURN_IF_ERROR(CheckRoot("broadcast", root, world_size()));
    DRAY_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(tensor.scalar_type()));
    return Run("broadcast", ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                                          type, root, comm_, stream_));
  }

  absl::Status AllGather(const at::Tensor& input, at::Tensor& output) override {
    DRAY_RETURN_IF_ERROR(Check(input, "all_gather input"));
    DRAY_RETURN_IF_ERROR(Check(output, "all_gather output"));
    DRAY_RETURN_IF_ERROR(CheckParts("all_gather", input, output, world_size()));
    DRAY_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(input.scalar_type()));
    return Run("all_gather", ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(), type,
                                           comm_, stream_));
  }

  absl::Status ReduceScatter(const at::Tensor& input, at::Tensor& output) override {
    DRAY_RETURN_IF_ERROR(Check(input, "reduce_scatter input"));
    DRAY_RETURN_IF_ERROR(Check(output, "reduce_scatter output"));
    DRAY_RETURN_IF_ERROR(CheckParts("reduce_scatter", output, input, world_size()));
    DRAY_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(input.scalar_type()));
    return Run("reduce_scatter", ncclReduceScatter(input.data_ptr(), output.data_ptr(),
                                                   output.numel(), type, ncclSum, comm_, stream_));
  }

  absl::Status AllToAll(const at::Tensor& input, at::Tensor& output) override {
    DRAY_RETURN_IF_ERROR(Check(input, "all_to_all input"));
    DRAY_RETURN_IF_ERROR(Check(output, "all_to_all output"));
    DRAY_RETURN_IF_ERROR(CheckAllToAll(input, output, world_size()));
    DRAY_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(input.scalar_type()));
    // NCCL has no all-to-all: a send and a receive for each peer, grouped.
    const size_t count = input.numel() / world_size();
    const size_t part_bytes = count * input.element_size();
    const char* sent = static_cast<const char*>(input.data_ptr());
    char* received = static_cast<char*>(output.data_ptr());
    DRAY_RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), "all_to_all"));
    ncclResult_t result = ncclSuccess;
    for (int peer = 0; peer < world_size() && result == ncclSuccess; ++peer) {
      result = ncclSend(sent + peer * part_bytes, count, type, peer, comm_, stream_);
      if (result == ncclSuccess)
        result = ncclRecv(received + peer * part_bytes, count, type, peer, comm_, stream_);
    }
    const ncclResult_t ended = ncclGroupEnd();
    return Run("all_to_all", result != ncclSuccess ? result : ended);
  }

  absl::Status Barrier() override {
    // An all-reduce of one byte that every rank must enter.
    void* byte = nullptr;
    DRAY_RETURN_IF_ERROR(CudaStatus(cudaMallocAsync(&byte, 1, stream_), "barrier"));
    absl::Status status =
        Run("barrier", ncclAllReduce(byte, byte, 1, ncclUint8, ncclSum, comm_, stream_));
    cudaFreeAsync(byte, stream_);
    return status;
  }

 private:
  absl::Status Check(const at::Tensor& tensor, absl::string_view what) const {
    if (!tensor.defined() || !tensor.is_cuda() || tensor.get_device() != device_ ||
        !tensor.is_contiguous()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": NCCL needs a contiguous CUDA tensor on device ", device_));
    }
    return absl::OkStatus();
  }

  // Run waits for a collective enqueued on the stream.
  absl::Status Run(absl::string_view what, ncclResult_t enqueued) {
    DRAY_RETURN_IF_ERROR(NcclStatus(enqueued, absl::StrCat(what, " on rank ", rank())));
    return CudaStatus(cudaStreamSynchronize(stream_), absl::StrCat(what, " on rank ", rank()));
  }

  std::shared_ptr<Rendezvous> rendezvous_;
  std::string name_;
  std::vector<int> ranks_;  // rendezvous ranks of this group's members, by group rank
  ncclComm_t comm_;
  cudaStream_t stream_;
  int device_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    std::shared_ptr<Rendezvous> rendezvous, const std::string& name, int device,
    std::vector<int> ranks) {
  const GroupAddress& address = rendezvous->address();
  DRAY_ASSIGN_OR_RETURN(ranks, GroupRanks(address, std::move(ranks)));
  const int group_rank =
      static_cast<int>(std::find(ranks.begin(), ranks.end(), address.rank) - ranks.begin());
  DRAY_RETURN_IF_ERROR(
      CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")));
  const std::string key = absl::StrCat("nccl/", name, "/", absl::StrJoin(ranks, ","), "/unique_id");
  ncclUniqueId id;
  try {
    c10d::Store& store = *rendezvous->store().store;
    if (group_rank == 0) {
      DRAY_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
      const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
      store.set(key, std::vector<uint8_t>(bytes, bytes + sizeof(id)));
    } else {
      const std::vector<uint8_t> bytes = store.get(key);  // waits for rank 0
      if (bytes.size() != sizeof(id)) {
        return absl::InternalError(
            absl::StrCat("NCCL id for '", name, "' has ", bytes.size(), " bytes"));
      }
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "rank ", address.rank, " could not exchange the NCCL id: ", ExceptionMessage(e)));
  }
  ncclComm_t comm;
  DRAY_RETURN_IF_ERROR(
      NcclStatus(ncclCommInitRank(&comm, static_cast<int>(ranks.size()), id, group_rank),
                 absl::StrCat("rank ", address.rank, " joining NCCL group '", name, "'")));
  // A blocking stream: its collectives wait for the work LibTorch queued on
  // the legacy default stream (the tensors they read), and the reverse.
  cudaStream_t stream;
  DRAY_RETURN_IF_ERROR(CudaStatus(cudaStreamCreate(&stream), "cudaStreamCreate"));
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(std::move(rendezvous), name, std::move(ranks), comm, stream, device));
}

}  // namespace dray
