// WorkerConnection: what calling a method of a group needs of each worker:
// submit a call and get a future for its result. WorkerClient is the real
// one (a Session stream to a worker process); FakeWorkerConnection
// (fake_worker_connection.h) stands in for it in unit tests of the dispatch
// and collect logic.
//
//   DRAY_ASSIGN_OR_RETURN(auto input, EncodeInput(batch));  // once, for any number of workers
//   CallFuture future =
//       connection->Submit("", "echo", input, absl::Now() + absl::Seconds(5), nullptr);
//   const absl::StatusOr<DataProto>& result = future->Wait();
//
// Thread-safety: implementations are thread-safe.
#ifndef DRAY_RUNTIME_CONTROLLER_WORKER_CONNECTION_H_
#define DRAY_RUNTIME_CONTROLLER_WORKER_CONNECTION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dispatch/data_proto.h"
#include "dispatch/wire.h"
#include "runtime/transport/segment_passage.h"

namespace dray {

// CallResult: the outcome of one call on one worker, set once.
//
// Thread-safety: thread-safe.
class CallResult {
 public:
  // Set stores the outcome and runs the OnReady callbacks; later Sets are ignored.
  void Set(absl::StatusOr<DataProto> value);

  bool ready() const;

  // Wait blocks until the outcome is set and returns it.
  const absl::StatusOr<DataProto>& Wait() const;

  // OnReady runs `callback` once the outcome is set: at once if it is, else
  // on the thread that sets it. Callbacks must be short and must not block.
  void OnReady(std::function<void()> callback);

  // Cancel asks the worker to stop the call early (its Worker::StopRequested
  // then says `why`); the outcome still comes from the worker. A no-op once
  // the outcome is set, or where the connection cannot cancel.
  void Cancel(const absl::Status& why);
  // SetCanceller is the connection's side of Cancel; it must not block.
  void SetCanceller(std::function<void(const absl::Status& why)> canceller);

 private:
  mutable absl::Mutex mu_;
  std::optional<absl::StatusOr<DataProto>> value_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
  std::function<void(const absl::Status&)> canceller_ ABSL_GUARDED_BY(mu_);
};

using CallFuture = std::shared_ptr<CallResult>;

// EncodedInput: a call's input in wire form, payload detached, shareable by
// the calls of every rank that receives the same input; on one node they
// share its shared-memory segment too.
struct EncodedInput : DetachedWire {
  explicit EncodedInput(DetachedWire wire) : DetachedWire(std::move(wire)) {}
  mutable SharedSegment segment;
};

absl::StatusOr<std::shared_ptr<const EncodedInput>> EncodeInput(const DataProto& input);

// CallProgressFn receives a running call's progress reports
// (Worker::ReportProgress), in order, before its result; on the connection's
// reading thread, so it must be short and must not block.
using CallProgressFn = std::function<void(const std::string& what, int64_t done, int64_t total)>;

class WorkerConnection {
 public:
  virtual ~WorkerConnection() = default;

  // Submit queues a call of `method` (of `role`; empty: any role), to run
  // after the calls submitted before it; it never waits on the worker.
  // `on_progress` (may be null) receives the call's progress reports.
  virtual CallFuture Submit(std::string role, std::string method,
                            std::shared_ptr<const EncodedInput> input, absl::Time deadline,
                            CallProgressFn on_progress) = 0;
};

}  // namespace dray

#endif  // DRAY_RUNTIME_CONTROLLER_WORKER_CONNECTION_H_
