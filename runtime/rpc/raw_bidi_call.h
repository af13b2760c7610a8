// RawBidiCall: the client's end of a bidirectional stream of raw byte
// buffers, on gRPC's generic asynchronous API (no generated stub needed):
// the controller's end of a WorkerService.Session (frames as in
// session_stream.h), or any streaming method a test speaks by hand.
//
// Writes never wait: Write queues the frame and returns, and frames go out
// one at a time, in order, as the previous one completes. Completions of
// both reads and writes arrive on the call's own completion queue, which
// only the reading thread drives: so a thread must keep reading for writes
// to progress, as WorkerClient's reader does.
//
//   DRAY_ASSIGN_OR_RETURN(auto call, RawBidiCall::Start(channel, SessionMethodName()));
//   WriteCallRequest(call.get(), request, payload);        // any thread
//   ReadCallResponse(call.get());                           // the reading thread
//   call->Cancel();                                         // any thread
//   ... join the reading thread ...
//   call.reset();                                           // ends the call
//
// Once a read fails the stream is over: later reads and writes fail at once.
//
// Thread-safety: one thread reads; writes are serialized by the caller (the
// frames of one message must not interleave with another's); Cancel from any
// thread. Destroy it only after the reading thread stopped reading.
#ifndef DRAY_RUNTIME_RPC_RAW_BIDI_CALL_H_
#define DRAY_RUNTIME_RPC_RAW_BIDI_CALL_H_

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/completion_queue.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/rpc/session_stream.h"

namespace dray {

class RawBidiCall final : public ClientSession {
 public:
  // Metadata: (key, value) pairs sent with the call.
  using Metadata = std::vector<std::pair<std::string, std::string>>;

  // Start calls `method` ("/package.Service/Method") on `channel` with
  // `metadata`, to end by `deadline` (a Session lasts as long as its group:
  // each call in it carries its own deadline); UNAVAILABLE if the call
  // cannot start.
  static absl::StatusOr<std::unique_ptr<RawBidiCall>> Start(
      const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
      absl::Time deadline = absl::InfiniteFuture(), const Metadata& metadata = {});
  ~RawBidiCall() override;
  RawBidiCall(const RawBidiCall&) = delete;
  RawBidiCall& operator=(const RawBidiCall&) = delete;

  bool Read(grpc::ByteBuffer* frame) override;
  bool Write(const grpc::ByteBuffer& frame) override;

  void Cancel() override { context_.TryCancel(); }
  // Finish also ends the call; later calls return the same.
  absl::Status Finish() override;

 private:
  explicit RawBidiCall(const std::shared_ptr<grpc::Channel>& channel);

  // Next waits for the next completion on the queue and handles it if it is
  // a write's; returns the tag.
  void* Next(bool* ok);
  // DrainWrites ends writing after a failed read: later writes fail, and it
  // waits until none is in flight.
  void DrainWrites();
  // PostWrite sends the first queued frame.
  void PostWrite() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  grpc::GenericStub stub_;
  grpc::ClientContext context_;
  grpc::CompletionQueue queue_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> stream_;
  // Distinct addresses tag the operations on the queue.
  char start_tag_ = 0, read_tag_ = 0, write_tag_ = 0, finish_tag_ = 0;
  std::optional<absl::Status> final_status_;  // set by Finish

  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> outgoing_ ABSL_GUARDED_BY(mu_);  // front: in flight
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dray

#endif  // DRAY_RUNTIME_RPC_RAW_BIDI_CALL_H_
