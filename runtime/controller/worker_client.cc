#include "runtime/controller/worker_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "dispatch/wire.h"
#include "dray/v1/worker.grpc.pb.h"
#include "runtime/rpc/grpc_util.h"
#include "runtime/rpc/raw_bidi_call.h"
#include "runtime/rpc/session_stream.h"
#include "runtime/security/job_secret.h"
#include "runtime/transport/socket_session.h"

namespace dray {
namespace {

constexpr absl::Duration kConnectTimeout = absl::Seconds(10);
constexpr absl::Duration kCancelTimeout = absl::Seconds(5);

CallFuture Ready(absl::StatusOr<DataProto> value) {
  auto result = std::make_shared<CallResult>();
  result->Set(std::move(value));
  return result;
}

// SendCancel asks the worker behind `channel` to stop session call
// `call_id`, without waiting for the answer: a worker that does not answer
// is the heartbeats' business.
void SendCancel(const std::shared_ptr<grpc::Channel>& channel, const std::string& job_secret,
                uint64_t call_id, const absl::Status& why) {
  struct Rpc {
    std::unique_ptr<v1::WorkerService::Stub> stub;
    grpc::ClientContext context;
    v1::CancelRequest request;
    v1::CancelResponse response;
  };
  auto* rpc = new Rpc;  // deleted when the answer, or the deadline, comes
  rpc->stub = v1::WorkerService::NewStub(channel);
  SetDeadline(&rpc->context, kCancelTimeout);
  AttachJobSecret(&rpc->context, job_secret);
  rpc->request.set_call_id(call_id);
  rpc->request.mutable_why()->set_code(static_cast<int32_t>(why.code()));
  rpc->request.mutable_why()->set_message(std::string(why.message()));
  rpc->stub->async()->Cancel(&rpc->context, &rpc->request, &rpc->response,
                             [rpc](const grpc::Status&) { delete rpc; });
}

}  // namespace

WorkerClient::WorkerClient(int rank, WorkerEndpoint endpoint, std::string job_secret,
                           std::function<void(absl::Status)> on_session_lost)
    : rank_(rank),
      address_(std::move(endpoint.address)),
      local_address_(std::move(endpoint.local_address)),
      job_secret_(std::move(job_secret)),
      on_session_lost_(std::move(on_session_lost)),
      segments_(std::move(endpoint.segments)) {}

WorkerClient::~WorkerClient() { Close(); }

absl::StatusOr<std::unique_ptr<ClientSession>> WorkerClient::StartGrpcSession() {
  if (!channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + kConnectTimeout))) {
    return absl::UnavailableError("cannot connect");
  }
  RawBidiCall::Metadata metadata = {{kJobSecretMetadata, job_secret_}};
  if (segments_ != nullptr) metadata.emplace_back(kSharedMemoryMetadata, "1");
  DRAY_ASSIGN_OR_RETURN(
      std::unique_ptr<RawBidiCall> call,
      RawBidiCall::Start(channel_, SessionMethodName(), absl::InfiniteFuture(), metadata));
  return call;
}

absl::Status WorkerClient::Open() {
  channel_ = CreateDrayChannel(address_);
  absl::StatusOr<std::unique_ptr<ClientSession>> call =
      local_address_.empty()
          ? StartGrpcSession()
          : SocketSession::Connect(local_address_, job_secret_, segments_ != nullptr);
  if (!call.ok()) {
    return absl::Status(call.status().code(), absl::StrCat("worker rank ", rank_, " at ", address(),
                                                           ": ", call.status().message()));
  }
  {
    absl::MutexLock lock(&write_mu_);
    call_ = std::move(call).value();
  }
  reader_ = std::thread(&WorkerClient::ReadLoop, this);
  watchdog_ = std::thread(&WorkerClient::WatchDeadlines, this);
  return absl::OkStatus();
}

CallFuture WorkerClient::Submit(std::string role, std::string method,
                                std::shared_ptr<const EncodedInput> input, absl::Time deadline,
                                CallProgressFn on_progress) {
  v1::CallRequest request;
  CallFuture future = std::make_shared<CallResult>();
  // One call's frames at a time, in submission order; handing them over
  // never waits on the worker.
  absl::MutexLock write(&write_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (failed_.has_value()) return Ready(*failed_);
    if (closing_ || call_ == nullptr) {
      return Ready(
          absl::FailedPreconditionError(absl::StrCat("worker rank ", rank_, " is not connected")));
    }
    request.set_call_id(next_call_id_++);
    pending_[request.call_id()] = {future, method, deadline, std::move(on_progress)};
    if (deadline < watched_until_) watched_until_ = deadline;  // wakes the watchdog
  }
  future->SetCanceller([channel = channel_, secret = job_secret_, call_id = request.call_id()](
                           const absl::Status& why) { SendCancel(channel, secret, call_id, why); });
  request.set_role(std::move(role));
  request.set_method(std::move(method));
  request.set_deadline_unix_ms(absl::ToUnixMillis(deadline));
  *request.mutable_input() = input->header;
  WriteCallRequest(call_.get(), std::move(request), input->payload, segments_.get(),
                   &input->segment);  // if broken, the reader says why
  return future;
}

void WorkerClient::Progress(const v1::CallProgress& progress) {
  CallProgressFn on_progress;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(progress.call_id());
    if (it == pending_.end()) return;  // already failed (deadline)
    on_progress = it->second.on_progress;
  }
  if (on_progress) on_progress(progress.what(), progress.done(), progress.total());
}

void WorkerClient::Resolve(uint64_t call_id, absl::StatusOr<DataProto> result) {
  CallFuture call;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(call_id);
    if (it == pending_.end()) return;  // already failed (deadline) or answered
    call = std::move(it->second.result);
    pending_.erase(it);
  }
  call->Set(std::move(result));
}

void WorkerClient::CancelPending(const absl::Status& why) {
  std::vector<CallFuture> pending;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [call_id, call] : pending_) pending.push_back(call.result);
  }
  for (const CallFuture& call : pending) call->Cancel(why);
}

void WorkerClient::Fail(absl::Status status) {
  std::map<uint64_t, Pending> failed_calls;
  {
    absl::MutexLock lock(&mu_);
    if (!failed_.has_value()) failed_ = status;
    failed_calls.swap(pending_);
    status = *failed_;
  }
  for (auto& [call_id, pending] : failed_calls) pending.result->Set(status);
  absl::MutexLock write(&write_mu_);
  if (call_ != nullptr) call_->Cancel();
}

std::optional<v1::ProcessMemory> WorkerClient::memory() const {
  absl::MutexLock lock(&mu_);
  return memory_;
}

void WorkerClient::ReadLoop() {
  ClientSession* call_for_reading;
  {
    absl::MutexLock lock(&write_mu_);  // replaced only after this thread ends
    call_for_reading = call_.get();
  }
  absl::Status ended = absl::OkStatus();
  while (true) {
    absl::StatusOr<std::optional<Received<v1::CallResponse>>> next = ReadCallResponse(
        call_for_reading, [this](const v1::CallProgress& progress) { Progress(progress); },
        segments_.get());
    if (!next.ok()) ended = next.status();
    if (!next.ok() || !next->has_value()) break;
    v1::CallResponse& response = (*next)->header;
    if (response.has_memory()) {
      absl::MutexLock lock(&mu_);
      memory_ = response.memory();
    }
    if (response.has_error()) {
      Resolve(response.call_id(),
              absl::Status(static_cast<absl::StatusCode>(response.error().code()),
                           response.error().message()));
      continue;
    }
    absl::StatusOr<DataProto> result = FromWire(response.result(), (*next)->payload);
    if (!result.ok()) {
      result = absl::InternalError(absl::StrCat(
          "worker rank ", rank_, " sent an undecodable result: ", result.status().message()));
    }
    Resolve(response.call_id(), std::move(result));
  }
  {
    absl::MutexLock lock(&mu_);
    if (closing_) return;
  }
  // Why the worker ended it, when it did (a refused secret, say); a broken
  // or cancelled stream makes the worker unavailable.
  const absl::Status finished = call_for_reading->Finish();
  if (ended.ok()) ended = finished;
  const absl::StatusCode code = finished.ok() || finished.code() == absl::StatusCode::kCancelled ||
                                        finished.code() == absl::StatusCode::kUnavailable
                                    ? absl::StatusCode::kUnavailable
                                    : finished.code();
  const absl::Status lost = absl::Status(
      code, absl::StrCat("the session with worker rank ", rank_, " at ", address_, " ended",
                         ended.ok() ? "" : absl::StrCat(": ", ended.message())));
  if (on_session_lost_) on_session_lost_(lost);
  Fail(lost);
}

void WorkerClient::WatchDeadlines() {
  absl::MutexLock lock(&mu_);
  while (!closing_) {
    absl::Time earliest = absl::InfiniteFuture();
    for (const auto& [call_id, pending] : pending_) earliest = std::min(earliest, pending.deadline);
    // Wake at the earliest deadline, or when a new call brings an earlier one.
    watched_until_ = earliest;
    auto woken = [this, earliest]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return closing_ || watched_until_ != earliest;
    };
    mu_.AwaitWithDeadline(absl::Condition(&woken), earliest);
    const absl::Time now = absl::Now();
    std::vector<Pending> expired;
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.deadline > now) {
        ++it;
        continue;
      }
      expired.push_back(std::move(it->second));
      it = pending_.erase(it);
    }
    mu_.Unlock();  // callbacks run outside the lock
    for (Pending& call : expired) {
      call.result->Set(absl::DeadlineExceededError(
          absl::StrCat("call '", call.method, "' on worker rank ", rank_, " passed its deadline")));
    }
    mu_.Lock();
  }
}

void WorkerClient::Close() {
  std::map<uint64_t, Pending> cancelled;
  {
    absl::MutexLock lock(&mu_);
    if (closing_) return;
    closing_ = true;
    cancelled.swap(pending_);
  }
  for (auto& [call_id, pending] : cancelled) {
    pending.result->Set(absl::CancelledError(absl::StrCat(
        "call '", pending.method, "' on worker rank ", rank_, ": the group shut down")));
  }
  {
    absl::MutexLock write(&write_mu_);
    if (call_ != nullptr) call_->Cancel();
  }
  for (std::thread* thread : {&reader_, &watchdog_}) {
    if (thread->joinable()) thread->join();
  }
  // Only now, with no reader left, may the stream end.
  absl::MutexLock write(&write_mu_);
  call_.reset();
}

}  // namespace dray
