// WorkerClient: the controller's connection to one worker process.
//
// Calls travel in order over one session (rpc/session_stream.h), so the
// worker runs them in the order they were submitted (actor semantics): a
// gRPC WorkerService.Session stream (rpc/raw_bidi_call.h), or for a worker
// of this node a SocketSession (rpc/socket_session.h), with large payloads
// in shared memory. Submit never waits on the worker: it hands the call's
// frames to the session, which sends them as the transport allows; a reader
// thread resolves futures, and a watchdog fails calls whose deadline
// passes. When the worker dies, Fail() resolves every pending call with the
// reason, and later calls fail at once.
//
//   WorkerClient client(2, {"127.0.0.1:4567"}, job_secret, on_session_lost);
//   DRAY_RETURN_IF_ERROR(client.Open());
//   DRAY_ASSIGN_OR_RETURN(auto input, EncodeInput(batch));  // once, for any number of workers
//   CallFuture future = client.Submit("", "echo", input, absl::Now() + absl::Seconds(5), nullptr);
//   absl::StatusOr<DataProto> result = future->Wait();
//
// Thread-safety: thread-safe.
#ifndef DRAY_RUNTIME_CONTROLLER_WORKER_CLIENT_H_
#define DRAY_RUNTIME_CONTROLLER_WORKER_CLIENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/channel.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dispatch/data_proto.h"
#include "dispatch/wire.h"
#include "runtime/controller/worker_connection.h"
#include "runtime/rpc/session_stream.h"
#include "runtime/transport/segment_passage.h"

namespace dray {

// WorkerEndpoint: where the controller reaches one worker.
struct WorkerEndpoint {
  std::string address;  // host:port of its WorkerService
  // For a worker of the controller's node: its SessionListener
  // (unix-abstract:NAME), where the session goes instead, and its
  // SegmentPassage, which carries large payloads both ways.
  std::string local_address;
  std::unique_ptr<SegmentPassage> segments;
};

class WorkerClient final : public WorkerConnection {
 public:
  // `on_session_lost` runs (on the reader thread) when the session ends
  // without Close(); it should Fail() the client with the best reason known.
  // Every call carries `job_secret` (rpc/job_secret.h).
  WorkerClient(int rank, WorkerEndpoint endpoint, std::string job_secret,
               std::function<void(absl::Status)> on_session_lost);
  ~WorkerClient();
  WorkerClient(const WorkerClient&) = delete;
  WorkerClient& operator=(const WorkerClient&) = delete;

  // Open starts the session; UNAVAILABLE if the worker cannot be reached,
  // UNAUTHENTICATED if it refuses the secret (a SocketSession says so here,
  // a gRPC session on the first call).
  absl::Status Open();

  CallFuture Submit(std::string role, std::string method, std::shared_ptr<const EncodedInput> input,
                    absl::Time deadline, CallProgressFn on_progress) override;

  // Fail resolves every pending call, and every later one, with `status`.
  // The first status wins.
  void Fail(absl::Status status);

  // CancelPending asks the worker to stop every call pending now
  // (CallResult::Cancel); it does not wait.
  void CancelPending(const absl::Status& why);

  // Close ends the session and joins the threads; pending calls fail CANCELLED.
  void Close();

  int rank() const { return rank_; }
  // memory: the worker's memory as it answered its last call (unset before).
  std::optional<v1::ProcessMemory> memory() const;
  // address: where the session goes (the local address, where there is one).
  const std::string& address() const { return local_address_.empty() ? address_ : local_address_; }

 private:
  struct Pending {
    CallFuture result;
    std::string method;
    absl::Time deadline;
    CallProgressFn on_progress;
  };
  // Progress hands a progress frame to its call's callback.
  void Progress(const v1::CallProgress& progress);
  // StartGrpcSession opens a Session stream on channel_.
  absl::StatusOr<std::unique_ptr<ClientSession>> StartGrpcSession();
  void ReadLoop();
  void WatchDeadlines();
  // Resolve completes pending call `call_id`, if it is still pending.
  void Resolve(uint64_t call_id, absl::StatusOr<DataProto> result);

  const int rank_;
  const std::string address_;
  const std::string local_address_;
  const std::string job_secret_;
  const std::function<void(absl::Status)> on_session_lost_;
  const std::unique_ptr<SegmentPassage> segments_;
  std::shared_ptr<grpc::Channel> channel_;  // Cancel, and a remote worker's session
  std::thread reader_, watchdog_;

  // Held while a call's frames are handed to the stream (they must not
  // interleave with another call's), and while the stream is replaced.
  absl::Mutex write_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::unique_ptr<ClientSession> call_ ABSL_GUARDED_BY(write_mu_);

  mutable absl::Mutex mu_;
  uint64_t next_call_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::optional<v1::ProcessMemory> memory_ ABSL_GUARDED_BY(mu_);
  // The deadline the watchdog waits for; an earlier call's wakes it.
  absl::Time watched_until_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> failed_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dray

#endif  // DRAY_RUNTIME_CONTROLLER_WORKER_CLIENT_H_
