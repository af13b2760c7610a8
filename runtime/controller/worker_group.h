// WorkerGroup: the controller's handle on a group of worker processes, dray's
// counterpart of verl's RayWorkerGroup.
//
// Create starts one worker process per rank (nodes x workers per node: by
// default all on this machine, as its children; with a NodePool, on the
// nodes whose agents attached to it), waits for each to register its
// method table, and opens a session to each. Calling a method on the group applies the
// method's dispatch mode: split the input across ranks, call them, collect.
//
//   WorkerGroupOptions options;
//   options.command = {"/usr/local/bin/dray", "worker"};
//   options.roles = {"echo"};
//   DRAY_ASSIGN_OR_RETURN(auto group, WorkerGroup::Create({1, 4}, options));
//   DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> out, group->Call("init_model", {config}));
//   GroupFuture pending = group->Invoke("echo", {batch});  // non-blocking methods return at once
//   DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> echoed, pending.Get());
//
// Security: the group makes a random job secret and hands it to each worker
// on its standard input; every WorkerService and ControllerService call must
// carry it (UNAUTHENTICATED otherwise), so other local processes cannot
// drive the workers, register as a rank, or shut them down.
//
// Failures: a worker error fails the call with the worker's status (naming
// rank and method); a call past its deadline fails with DEADLINE_EXCEEDED
// and leaves the worker usable. A rank that fails (its process exits, its
// session breaks, or its heartbeats stop for stall_timeout: a stopped or
// unreachable process) fails the group: every pending and later call on it
// gets UNAVAILABLE naming the rank and the cause, Health reports it, and
// on_failure hears of it once, so that a supervisor can restart the group
// (a group is never repaired in place: collectives need every rank). Worker
// processes die with the controller, and Shutdown (or the destructor) reaps
// every process the group started.
//
// Unless the controller's environment sets OMP_NUM_THREADS, each worker gets
// its share of the machine's cores (cores / workers per node, or /
// processes_sharing_cores), as torchrun does, so that workers on one
// machine do not oversubscribe it, and OpenMP threads that sleep between
// parallel regions rather than spin (AddCpuShareEnv).
//
// Thread-safety: thread-safe; calls from several threads may be in flight.
#ifndef DRAY_RUNTIME_CONTROLLER_WORKER_GROUP_H_
#define DRAY_RUNTIME_CONTROLLER_WORKER_GROUP_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dispatch/data_proto.h"
#include "dispatch/dispatch_mode.h"
#include "dray/v1/worker.pb.h"
#include "runtime/controller/method_dispatcher.h"
#include "runtime/controller/node_pool.h"
#include "runtime/controller/rank_memory.h"

namespace dray {

// ResourceSpec: how many worker processes, laid out as nodes x workers per
// node (LOCAL_RANK counts within a node). On one machine, the "nodes" are a
// layout only and CUDA_VISIBLE_DEVICES = LOCAL_RANK; on a NodePool they are
// machines, each giving its own GPUs by local rank.
struct ResourceSpec {
  int nodes = 1;
  int workers_per_node = 1;

  int world_size() const { return nodes * workers_per_node; }
};

struct WorkerGroupOptions {
  // The worker executable and its leading arguments, e.g. {"/bin/dray",
  // "worker"}; the group appends --controller= and --roles=.
  std::vector<std::string> command;
  // Worker classes every process hosts (colocated roles).
  std::vector<std::string> roles;
  // How long workers may take to start and register.
  absl::Duration register_timeout = absl::Seconds(60);
  // Deadline of a call that sets none.
  absl::Duration call_timeout = absl::Minutes(30);
  // How often workers check that the controller is alive (and show that
  // they are), and how long a rank may stay silent before it counts as
  // stalled.
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration stall_timeout = absl::Seconds(10);
  // Called once, on the group's first failure after Create returned (from
  // one of the group's threads; keep it short, and do not shut the group
  // down from it).
  std::function<void(const absl::Status& cause)> on_failure;
  // The address collectives (Gloo, NCCL) bind to; the ranks meet through a
  // c10d store file in a directory only this user may enter, so that no
  // store listens on any port.
  std::string master_addr = "127.0.0.1";
  // Shown before each line a worker on this machine prints, "[LABEL rank N]"
  // (empty: "[rank N]"), to tell groups apart.
  std::string label;
  // Extra environment variables for every worker.
  std::vector<std::pair<std::string, std::string>> env;
  // How many processes on this machine share its cores, other groups'
  // included (each worker's OMP_NUM_THREADS is cores / this); 0: this
  // group's workers per node.
  int processes_sharing_cores = 0;
  // How calls reach workers on the controller's own node (same machine and
  // network namespace): kAuto through their unix socket, kTcp over TCP as
  // on other nodes (also when the environment has DRAY_TRANSPORT=tcp).
  enum class Transport { kAuto, kTcp };
  Transport transport = Transport::kAuto;
  // Local rank r uses the node's GPU first_gpu + r (CUDA_VISIBLE_DEVICES):
  // groups that share nodes take different GPUs.
  int first_gpu = 0;
  // Set: the ranks run on this pool's nodes (controller/node_pool.h), which
  // must outlive the group; the group's controller service then listens on
  // the pool's host, and command and master_addr are unused (each node's
  // agent knows how to start a worker; rank 0's node hosts the store).
  // Unset: the group starts its workers on this machine.
  NodePool* nodes = nullptr;
};

class WorkerGroup {
 public:
  static absl::StatusOr<std::unique_ptr<WorkerGroup>> Create(const ResourceSpec& resources,
                                                             WorkerGroupOptions options);
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  int world_size() const { return dispatcher_->world_size(); }

  // methods returns the method table every rank published.
  const std::vector<v1::MethodInfo>& methods() const { return dispatcher_->methods(); }

  // Invoke calls `method` ("name", or "role.name" when roles share a name)
  // with the caller's inputs, dispatched by the method's mode. It returns
  // once the result is in for blocking methods, at once for non-blocking ones.
  GroupFuture Invoke(absl::string_view method, std::vector<DataProto> inputs,
                     const CallOptions& options = {});

  // Call invokes `method` and waits for its result, whatever the method's
  // blocking flag.
  absl::StatusOr<std::vector<DataProto>> Call(absl::string_view method,
                                              std::vector<DataProto> inputs,
                                              const CallOptions& options = {});

  // Shutdown asks every worker to exit, waits a little, then kills and reaps
  // what is left. Later calls fail with FAILED_PRECONDITION. Idempotent.
  void Shutdown();

  // CancelCalls asks every rank to stop the calls pending on it early, as
  // GroupFuture::Cancel does for one call; the group stays usable.
  void CancelCalls(const absl::Status& why);

  // Abort kills every worker at once (no grace: their work is lost) and
  // fails pending and later calls with `why`. For a deadline that cannot
  // wait for a polite Shutdown. Idempotent with Shutdown.
  void Abort(const absl::Status& why);

  // Health is OK while every rank works; otherwise UNAVAILABLE naming the
  // first rank that failed and why (its exit status or signal, a broken
  // session, a stall), or saying that the group has shut down.
  absl::Status Health() const;

  // HealthAfterFailure is Health once the group has failed, or after
  // `timeout`: for a caller whose call just failed, since a rank's error
  // (a collective broken by a dead peer) may arrive before the peer's death.
  absl::Status HealthAfterFailure(absl::Duration timeout) const;

  // traffic: the bytes the group's calls have sent and received so far.
  GroupTraffic traffic() const { return dispatcher_->traffic(); }

  // pids returns the worker processes' ids, by rank.
  std::vector<pid_t> pids() const;

  // memory: each rank's memory as it answered its last call, by rank.
  std::vector<RankMemory> memory() const;

  // worker_addresses returns where each rank's WorkerService (and
  // grpc.health.v1) listens, as host:port.
  std::vector<std::string> worker_addresses() const;

  // call_addresses returns where the group's calls reach each rank: its
  // unix socket (unix-abstract:...) on the controller's node, else host:port.
  std::vector<std::string> call_addresses() const;

  // controller_address returns where the ControllerService (and
  // grpc.health.v1) listens, as host:port.
  std::string controller_address() const;

  // job_secret: what every call to the workers must carry (rpc/job_secret.h),
  // for clients that speak WorkerService themselves. Keep it out of logs.
  const std::string& job_secret() const;

 private:
  class Impl;
  explicit WorkerGroup(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
  std::unique_ptr<MethodDispatcher> dispatcher_;
};

}  // namespace dray

#endif  // DRAY_RUNTIME_CONTROLLER_WORKER_GROUP_H_
