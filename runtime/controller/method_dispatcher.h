// MethodDispatcher: calling a method on every rank of a group, as the
// method's dispatch mode says: split the caller's inputs into one input per
// rank, encode each distinct input once, submit to each rank's connection,
// and collect the outputs when all are in (or fail at the first error).
// WorkerGroup owns the processes and connections and hands calls to it; its
// unit tests run it over FakeWorkerConnections.
//
//   MethodDispatcher dispatcher(method_table, {&client0, &client1});
//   GroupFuture pending = dispatcher.Invoke("square", {batch}, absl::Now() + absl::Minutes(1));
//   DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> out, pending.Get());
//
// Thread-safety: thread-safe; the connections must outlive it.
#ifndef DRAY_RUNTIME_CONTROLLER_METHOD_DISPATCHER_H_
#define DRAY_RUNTIME_CONTROLLER_METHOD_DISPATCHER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "dispatch/data_proto.h"
#include "dispatch/dispatch_mode.h"
#include "dray/v1/worker.pb.h"
#include "runtime/controller/worker_connection.h"

namespace dray {

// GroupFuture: the pending result of a call on a group.
class GroupFuture {
 public:
  // Failed returns a future that holds `status`.
  static GroupFuture Failed(absl::Status status);

  // Get waits for every rank and returns the collected outputs, or the first
  // error any rank answered (without waiting for the others). It may be
  // called more than once.
  absl::StatusOr<std::vector<DataProto>> Get();

  // Ready is true when Get would not wait.
  bool Ready() const;

  // Cancel asks every rank to stop the call early (CallResult::Cancel):
  // methods that check Worker::StopRequested end with `why` between units
  // of work; Get still waits for the ranks' answers.
  void Cancel(const absl::Status& why);

 private:
  friend class MethodDispatcher;
  struct State;
  std::shared_ptr<State> state_;
};

// GroupProgressFn receives every rank's progress reports of one call, on
// the connections' reading threads (see CallProgressFn): keep it short.
using GroupProgressFn =
    std::function<void(int rank, const std::string& what, int64_t done, int64_t total)>;

struct CallOptions {
  // Deadline, from now; unset: WorkerGroupOptions::call_timeout.
  std::optional<absl::Duration> timeout;
  // Receives the call's Worker::ReportProgress from every rank, over each
  // rank's Session stream, before the result (keep it short; calls from
  // different ranks may overlap).
  GroupProgressFn on_progress;
  // Split even a rows_independent method's batch into equal, padded shards:
  // for calls whose ranks must run in step (collectives inside, as with a
  // sharded model).
  bool equal_shards = false;
  // Ranks that compute each share together (one edit's CFG branches or
  // sequence parts, collectives inside): the mode splits the inputs among
  // world_size / rank_group_size groups of consecutive ranks, every rank of
  // a group receives the group's input, and only each group's first rank's
  // output is collected. It must divide the world size.
  int rank_group_size = 1;
};

// GroupTraffic: the bytes (ContentBytes) a group's calls have moved so far:
// each rank's input (an input several ranks share counts once per rank) and
// each rank's result.
struct GroupTraffic {
  int64_t sent_bytes = 0;
  int64_t received_bytes = 0;
};

class MethodDispatcher {
 public:
  // `methods`: the method table every rank published; `workers`: one
  // connection per rank, in rank order.
  MethodDispatcher(std::vector<v1::MethodInfo> methods, std::vector<WorkerConnection*> workers);

  // Invoke calls `method` ("name", or "role.name" when roles share a name)
  // with the caller's inputs, each rank's call to end by `deadline` (the
  // options' timeout is the caller's business). It returns once the result
  // is in for blocking methods, at once otherwise.
  GroupFuture Invoke(absl::string_view method, std::vector<DataProto> inputs, absl::Time deadline,
                     const CallOptions& options = {});

  const std::vector<v1::MethodInfo>& methods() const { return methods_; }
  int world_size() const { return static_cast<int>(workers_.size()); }
  // traffic: what the calls collected so far have moved (a result counts
  // once a GroupFuture's Get has collected it).
  GroupTraffic traffic() const;

 private:
  // FindMethod resolves "name" or "role.name"; NOT_FOUND / INVALID_ARGUMENT
  // name the known methods.
  absl::StatusOr<const v1::MethodInfo*> FindMethod(absl::string_view method) const;
  // Plan splits `inputs` into one input per rank (none for ranks the method
  // does not run on).
  absl::StatusOr<DispatchPlan> Plan(const v1::MethodInfo& info, const DispatchMode& mode,
                                    std::vector<DataProto> inputs,
                                    const CallOptions& options) const;

  struct TrafficCounters;

  const std::vector<v1::MethodInfo> methods_;
  const std::vector<WorkerConnection*> workers_;
  const std::shared_ptr<TrafficCounters> traffic_;  // shared with the futures
};

}  // namespace dray

#endif  // DRAY_RUNTIME_CONTROLLER_METHOD_DISPATCHER_H_
