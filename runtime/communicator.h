// Communicator: collective operations among the ranks of a worker group.
//
// Worker methods and the sharding code talk to their peers only through this
// small interface, so that LibTorch 1.13's ProcessGroup (Gloo, here), 2.x's
// Backend API and NCCL all fit behind it. Tensors are dense and contiguous;
// every collective is entered by every rank of the group, in the same order.
//
//   DRAY_ASSIGN_OR_RETURN(Communicator* comm, worker.comm());
//   DRAY_RETURN_IF_ERROR(comm->AllReduce(gradients));  // summed over ranks
//
// Errors: UNAVAILABLE when a peer is gone or a collective times out,
// INVALID_ARGUMENT for tensors of the wrong shape, dtype or layout.
//
// Thread-safety: not thread-safe; use one communicator from one thread.
#ifndef DRAY_RUNTIME_COMMUNICATOR_H_
#define DRAY_RUNTIME_COMMUNICATOR_H_

#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dray {

enum class ReduceOp { kSum, kMin, kMax };

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // AllReduce combines `tensor` across ranks, in place.
  virtual absl::Status AllReduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum) = 0;

  // Broadcast copies rank `root`'s `tensor` to every rank, in place.
  virtual absl::Status Broadcast(at::Tensor& tensor, int root) = 0;

  // AllGather writes every rank's `input`, in rank order, into `output`,
  // which holds world_size() * input.numel() elements of input's dtype.
  virtual absl::Status AllGather(const at::Tensor& input, at::Tensor& output) = 0;

  // ReduceScatter sums `input` (world_size() equal parts, flattened) across
  // ranks and leaves part rank() of the sum in `output`.
  virtual absl::Status ReduceScatter(const at::Tensor& input, at::Tensor& output) = 0;

  // Barrier returns once every rank has entered it.
  virtual absl::Status Barrier() = 0;
};

// GroupAddress: where the ranks of a group meet. Rank 0 hosts a c10d
// TCPStore at master_addr:master_port; the others connect to it.
struct GroupAddress {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // How long to wait for peers, at setup and in each collective.
  absl::Duration timeout = absl::Minutes(5);
};

// CreateGlooCommunicator joins the group at `address` over Gloo (CPU tensors).
// Every rank must call it; it returns once all have joined.
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const GroupAddress& address);

}  // namespace dray

#endif  // DRAY_RUNTIME_COMMUNICATOR_H_
