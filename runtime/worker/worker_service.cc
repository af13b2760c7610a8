#include "runtime/worker/worker_service.h"

#include <algorithm>
#include <memory>
#include <thread>
#include <utility>

#include <grpcpp/completion_queue.h>
#include <grpcpp/support/async_stream.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/cuda_devices.h"
#include "base/process_memory.h"
#include "dispatch/wire.h"
#include "runtime/rpc/grpc_util.h"
#include "runtime/rpc/session_stream.h"
#include "runtime/security/job_secret.h"

namespace dray {
namespace {

void SetError(const absl::Status& status, v1::CallResponse* response) {
  response->mutable_error()->set_code(static_cast<int>(status.code()));
  response->mutable_error()->set_message(std::string(status.message()));
}

// SessionCall: one Session stream on the asynchronous API, with a
// completion queue of its own that only the session's thread drives: each
// Read and Write waits for its own completion, as the synchronous API does.
class SessionCall final : public SessionReader, public SessionWriter {
 public:
  SessionCall() = default;
  ~SessionCall() override {
    queue.Shutdown();
    void* tag;
    bool ok;
    while (queue.Next(&tag, &ok)) {
    }
  }

  bool Read(grpc::ByteBuffer* frame) override {
    stream.Read(frame, this);
    return Completed();
  }
  bool Write(const grpc::ByteBuffer& frame) override {
    stream.Write(frame, this);
    return Completed();
  }
  void Finish(const grpc::Status& status) {
    stream.Finish(status, this);
    Completed();
  }

  grpc::ServerContext context;
  grpc::ServerAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer> stream{&context};
  grpc::CompletionQueue queue;  // this call's operations complete here

 private:
  // Completed waits for the one operation in flight; false if it failed.
  bool Completed() {
    void* tag;
    bool ok = false;
    return queue.Next(&tag, &ok) && ok;
  }
};

}  // namespace

WorkerServiceImpl::WorkerServiceImpl(WorkerHost* host, int rank, std::string job_secret,
                                     std::function<void(std::string reason)> on_shutdown,
                                     SegmentPassage* segments)
    : host_(host),
      rank_(rank),
      job_secret_(std::move(job_secret)),
      on_shutdown_(std::move(on_shutdown)),
      segments_(segments) {}

void WorkerServiceImpl::AcceptSessions(grpc::ServerCompletionQueue* queue) {
  void* tag;
  bool ok = false;
  while (true) {
    auto call = std::make_unique<SessionCall>();
    {
      absl::MutexLock lock(&accept_mu_);
      if (stopping_) break;
      RequestSession(&call->context, &call->stream, &call->queue, queue, call.get());
    }
    if (!queue->Next(&tag, &ok) || !ok) break;  // the server is shutting down
    {
      absl::MutexLock lock(&mu_);
      ++running_sessions_;
    }
    std::thread([this, call = std::move(call)]() mutable {
      const absl::Status allowed = CheckJobSecret(call->context, job_secret_);
      const bool shared_memory = call->context.client_metadata().count(kSharedMemoryMetadata) > 0;
      call->Finish(
          ToGrpcStatus(allowed.ok() ? RunSession(call.get(), call.get(), shared_memory) : allowed));
      call.reset();
      absl::MutexLock lock(&mu_);
      --running_sessions_;
    }).detach();
  }
  while (queue->Next(&tag, &ok)) {
  }  // until the queue is shut down: no request may follow
}

void WorkerServiceImpl::StopSessions(grpc::Server* server, grpc::ServerCompletionQueue* queue,
                                     absl::Time deadline) {
  {
    absl::MutexLock lock(&accept_mu_);
    stopping_ = true;
  }
  server->Shutdown(absl::ToChronoTime(deadline));
  queue->Shutdown();
  absl::MutexLock lock(&accept_mu_);
  for (SocketSession* session : socket_sessions_) session->Cancel();
}

void WorkerServiceImpl::ServeSession(std::unique_ptr<SocketSession> session, bool shared_memory) {
  {
    absl::MutexLock lock(&accept_mu_);
    if (stopping_) {
      session->End(absl::UnavailableError("the worker is shutting down"));
      return;
    }
    socket_sessions_.insert(session.get());
  }
  {
    absl::MutexLock lock(&mu_);
    ++running_sessions_;
  }
  session->End(RunSession(session.get(), session.get(), shared_memory));
  {
    absl::MutexLock lock(&accept_mu_);
    socket_sessions_.erase(session.get());
  }
  session.reset();  // sends what is queued, the end included
  absl::MutexLock lock(&mu_);
  --running_sessions_;
}

void WorkerServiceImpl::WaitForSessions() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* running) { return *running == 0; }, &running_sessions_));
}

absl::Status WorkerServiceImpl::StopRequested(uint64_t call_id, bool cancellable,
                                              int64_t deadline_unix_ms) {
  if (deadline_unix_ms != 0 && absl::ToUnixMillis(absl::Now()) > deadline_unix_ms) {
    return absl::DeadlineExceededError("the caller's deadline passed");
  }
  if (!cancellable) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  auto it = cancelled_.find(call_id);
  return it == cancelled_.end() ? absl::OkStatus() : it->second;
}

void WorkerServiceImpl::Finished(uint64_t call_id) {
  absl::MutexLock lock(&mu_);
  finished_ = std::max(finished_, call_id);
  cancelled_.erase(cancelled_.begin(), cancelled_.upper_bound(finished_));
}

v1::CallResponse WorkerServiceImpl::Run(const v1::CallRequest& request,
                                        const ScatteredPayload& input_payload,
                                        ScatteredPayload* payload, bool cancellable,
                                        const ProgressSink& progress) {
  v1::CallResponse response;
  response.set_call_id(request.call_id());
  const std::string what = absl::StrCat("rank ", rank_, ", ", request.method());
  CallHooks hooks;
  hooks.progress = progress;
  hooks.stop = [this, call_id = request.call_id(), cancellable,
                deadline = request.deadline_unix_ms()] {
    return StopRequested(call_id, cancellable, deadline);
  };
  absl::StatusOr<DataProto> input = FromWire(request.input(), input_payload);
  if (!input.ok()) {
    SetError(
        absl::InvalidArgumentError(absl::StrCat(what, ": bad input: ", input.status().message())),
        &response);
    return response;
  }
  absl::StatusOr<DataProto> result =
      host_->Execute(request.role(), request.method(), *input, hooks);
  v1::ProcessMemory& memory = *response.mutable_memory();
  memory.set_resident_bytes(ResidentBytes());
  memory.set_device_allocated_bytes(CudaAllocatedBytes(/*device=*/0));  // its GPU, if any
  absl::StatusOr<DetachedWire> encoded =
      result.ok() ? ToDetachedWire(*result) : absl::StatusOr<DetachedWire>(result.status());
  if (!encoded.ok()) {
    SetError(encoded.status(), &response);
    return response;
  }
  *payload = std::move(encoded->payload);
  *response.mutable_result() = std::move(encoded->header);
  return response;
}

grpc::Status WorkerServiceImpl::Call(grpc::ServerContext* context, const v1::CallRequest* request,
                                     v1::CallResponse* response) {
  if (absl::Status allowed = CheckJobSecret(*context, job_secret_); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  ScatteredPayload payload;
  *response = Run(*request, ScatteredPayload::Whole(Bytes(request->input().payload())), &payload,
                  /*cancellable=*/false);
  if (response->has_result()) response->mutable_result()->set_payload(payload.Flatten());
  return grpc::Status::OK;
}

absl::Status WorkerServiceImpl::RunSession(SessionReader* reader, SessionWriter* writer,
                                           bool shared_memory) {
  while (true) {
    absl::StatusOr<std::optional<Received<v1::CallRequest>>> request =
        ReadCallRequest(reader, segments_);
    if (!request.ok()) return request.status();
    if (!request->has_value()) return absl::OkStatus();  // the controller closed the session
    ScatteredPayload payload;
    const uint64_t call_id = (*request)->header.call_id();
    v1::CallResponse response =
        Run((*request)->header, (*request)->payload, &payload, /*cancellable=*/true,
            [writer, call_id](const std::string& what, int64_t done, int64_t total) {
              v1::CallProgress progress;
              progress.set_call_id(call_id);
              progress.set_what(what);
              progress.set_done(done);
              progress.set_total(total);
              WriteCallProgress(writer, std::move(progress));  // if broken, the next write says so
            });
    Finished(call_id);
    request->reset();  // the input's payload (a segment, say) is no longer needed
    if (!WriteCallResponse(writer, std::move(response), payload,
                           shared_memory ? segments_ : nullptr)) {
      return absl::CancelledError("session: the controller went away");
    }
  }
}

grpc::Status WorkerServiceImpl::Cancel(grpc::ServerContext* context,
                                       const v1::CancelRequest* request, v1::CancelResponse*) {
  if (absl::Status allowed = CheckJobSecret(*context, job_secret_); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  const int32_t code = request->why().code();
  if (code <= 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("Cancel: `why` needs an error code, not ", code));
  }
  absl::MutexLock lock(&mu_);
  if (request->call_id() > finished_) {
    cancelled_.emplace(request->call_id(),
                       absl::Status(static_cast<absl::StatusCode>(code), request->why().message()));
  }
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::DescribeMethods(grpc::ServerContext* context,
                                                const v1::DescribeMethodsRequest*,
                                                v1::MethodTable* response) {
  if (absl::Status allowed = CheckJobSecret(*context, job_secret_); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  *response = host_->Describe();
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::Shutdown(grpc::ServerContext* context,
                                         const v1::ShutdownRequest* request,
                                         v1::ShutdownResponse*) {
  if (absl::Status allowed = CheckJobSecret(*context, job_secret_); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  on_shutdown_(request->reason());
  return grpc::Status::OK;
}

}  // namespace dray
