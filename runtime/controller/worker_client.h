// WorkerClient: the controller's connection to one worker process.
//
// Calls travel in order over one WorkerService.Session stream, so the worker
// runs them in the order they were submitted (actor semantics); each call's
// input and result stream in chunks, whatever their size. Submit never
// waits on the worker: a writer thread sends (a small call to an idle worker
// is sent by the caller itself), a reader thread resolves futures, and a
// watchdog fails calls whose deadline passes. When the worker dies, Fail()
// resolves every pending call with the reason, and later calls fail at once.
//
//   WorkerClient client(2, "127.0.0.1:4567", on_session_lost);
//   DRAY_RETURN_IF_ERROR(client.Open());
//   DRAY_ASSIGN_OR_RETURN(auto input, EncodeInput(batch));  // once, for any number of workers
//   CallFuture future = client.Submit("", "echo", input, absl::Now() + absl::Seconds(5));
//   absl::StatusOr<DataProto> result = future->Wait();
//
// Thread-safety: thread-safe.
#ifndef DRAY_RUNTIME_CONTROLLER_WORKER_CLIENT_H_
#define DRAY_RUNTIME_CONTROLLER_WORKER_CLIENT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/sync_stream.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dispatch/data_proto.h"
#include "dispatch/wire.h"

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

 private:
  mutable absl::Mutex mu_;
  std::optional<absl::StatusOr<DataProto>> value_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
};

using CallFuture = std::shared_ptr<CallResult>;

// EncodedInput: a call's input in wire form, payload detached, shareable by
// the calls of every rank that receives the same input.
using EncodedInput = DetachedWire;

absl::StatusOr<std::shared_ptr<const EncodedInput>> EncodeInput(const DataProto& input);

class WorkerClient {
 public:
  // `on_session_lost` runs (on the reader thread) when the session ends
  // without Close(); it should Fail() the client with the best reason known.
  WorkerClient(int rank, std::string address, std::function<void(absl::Status)> on_session_lost);
  ~WorkerClient();
  WorkerClient(const WorkerClient&) = delete;
  WorkerClient& operator=(const WorkerClient&) = delete;

  // Open starts the session; UNAVAILABLE if the worker cannot be reached.
  absl::Status Open();

  // Submit queues a call of `method` (of `role`; empty: any role).
  CallFuture Submit(std::string role, std::string method, std::shared_ptr<const EncodedInput> input,
                    absl::Time deadline);

  // Fail resolves every pending call, and every later one, with `status`.
  // The first status wins.
  void Fail(absl::Status status);

  // Close ends the session and joins the threads; pending calls fail CANCELLED.
  void Close();

  int rank() const { return rank_; }
  const std::string& address() const { return address_; }

 private:
  struct Pending {
    CallFuture result;
    std::string method;
    absl::Time deadline;
  };
  struct Outgoing {
    uint64_t call_id;
    std::string role;
    std::string method;
    std::shared_ptr<const EncodedInput> input;
    absl::Time deadline;
  };

  // WriteCall writes `call` on the stream; false when the stream broke.
  bool WriteCall(const Outgoing& call);
  void WriteLoop();
  void ReadLoop();
  void WatchDeadlines();
  // Resolve completes pending call `call_id`, if it is still pending.
  void Resolve(uint64_t call_id, absl::StatusOr<DataProto> result);

  const int rank_;
  const std::string address_;
  const std::function<void(absl::Status)> on_session_lost_;
  std::shared_ptr<grpc::Channel> channel_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream_;
  std::thread writer_, reader_, watchdog_;

  absl::Mutex mu_;
  uint64_t next_call_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t submitted_ ABSL_GUARDED_BY(mu_) = 0;  // wakes the watchdog
  std::map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::deque<Outgoing> outgoing_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> failed_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;  // one thread at a time writes the stream
};

}  // namespace dray

#endif  // DRAY_RUNTIME_CONTROLLER_WORKER_CLIENT_H_
