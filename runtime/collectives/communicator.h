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
#ifndef DRAY_RUNTIME_COLLECTIVES_COMMUNICATOR_H_
#define DRAY_RUNTIME_COLLECTIVES_COMMUNICATOR_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

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

  // AllToAll sends part i of `input` (world_size() equal parts, flattened)
  // to rank i and writes the part rank j sent this one into part j of
  // `output` (input's size and dtype): Ulysses' exchange of sequence parts
  // for heads.
  virtual absl::Status AllToAll(const at::Tensor& input, at::Tensor& output) = 0;

  // Barrier returns once every rank has entered it.
  virtual absl::Status Barrier() = 0;

  // Subgroup makes a communicator over `ranks` (of this group; this rank
  // among them, sorted), called `name`. Every rank in `ranks` must call it.
  // Each call makes a new group, also for a name used before (two modules
  // sharded over one communicator): every member makes them in one order.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Subgroup(const std::vector<int>& ranks,
                                                                 const std::string& name) = 0;

 protected:
  // UniqueSubgroupName: `name`, then "name.1", "name.2"... for later groups of
  // the same name, so that each meets under its own keys in the store.
  std::string UniqueSubgroupName(const std::string& name) {
    const int made = subgroups_made_[name]++;
    return made == 0 ? name : name + "." + std::to_string(made);
  }

 private:
  std::map<std::string, int> subgroups_made_;
};

// GroupAddress: where the ranks of a group meet.
struct GroupAddress {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // This rank's own address, where its collectives' connections bind (on a
  // node that is not MASTER_ADDR's); empty: master_addr, one machine.
  std::string node_addr;
  // Set: the ranks, all on one machine, meet through this file (a c10d
  // FileStore, in a directory only the job's user may enter) and nothing
  // listens for the store; master_port is unused.
  std::string store_file;
  // How long to wait for peers, at setup and in each collective.
  absl::Duration timeout = absl::Minutes(5);

  const std::string& local_addr() const { return node_addr.empty() ? master_addr : node_addr; }
};

// Rendezvous: the c10d store where the ranks of a group meet: the FileStore
// at store_file, or else the TCPStore that rank 0 hosts at
// master_addr:master_port (on every interface: multi-node only) and the
// other ranks join. One per process and group; every communicator of
// the group (Gloo, NCCL) meets through it under its own name.
//
// Thread-safety: thread-safe.
class Rendezvous {
 public:
  // Join connects (rank 0: starts the store). Every rank must call it.
  static absl::StatusOr<std::shared_ptr<Rendezvous>> Join(const GroupAddress& address);

  const GroupAddress& address() const { return address_; }

  // The c10d store, for communicator implementations (opaque here to keep
  // c10d's headers out of this one).
  struct Store;
  Store& store() const { return *store_; }

  ~Rendezvous();

 private:
  Rendezvous(GroupAddress address, std::unique_ptr<Store> store);
  GroupAddress address_;
  std::unique_ptr<Store> store_;
};

// CreateGlooCommunicator joins a Gloo group (CPU tensors) called `name`,
// over `ranks` of the rendezvous (empty: all of them). Every member must
// call it; it returns once all have joined.
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    std::shared_ptr<Rendezvous> rendezvous, const std::string& name, std::vector<int> ranks = {});

// CreateNcclCommunicator joins an NCCL group (CUDA tensors on `device`)
// called `name`, over `ranks` (empty: all). Only a --config=cuda build has
// NCCL; elsewhere it returns UNIMPLEMENTED.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    std::shared_ptr<Rendezvous> rendezvous, const std::string& name, int device,
    std::vector<int> ranks = {});

// GroupRanks returns `ranks`, or all ranks of `address` when empty, checking
// that they are sorted, distinct, in range, and include address.rank.
absl::StatusOr<std::vector<int>> GroupRanks(const GroupAddress& address, std::vector<int> ranks);

}  // namespace dray

#endif  // DRAY_RUNTIME_COLLECTIVES_COMMUNICATOR_H_
