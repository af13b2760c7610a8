#include "runtime/controller/worker_client.h"

#include <grpcpp/impl/rpc_method.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "dispatch/wire.h"
#include "runtime/rpc/grpc_util.h"
#include "runtime/rpc/session_stream.h"

namespace dray {
namespace {

constexpr absl::Duration kConnectTimeout = absl::Seconds(10);

CallFuture Ready(absl::StatusOr<DataProto> value) {
  auto result = std::make_shared<CallResult>();
  result->Set(std::move(value));
  return result;
}

}  // namespace

void CallResult::Set(absl::StatusOr<DataProto> value) {
  std::vector<std::function<void()>> callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (value_.has_value()) return;
    value_ = std::move(value);
    callbacks.swap(callbacks_);
  }
  for (auto& callback : callbacks) callback();
}

bool CallResult::ready() const {
  absl::MutexLock lock(&mu_);
  return value_.has_value();
}

const absl::StatusOr<DataProto>& CallResult::Wait() const {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](const std::optional<absl::StatusOr<DataProto>>* value) { return value->has_value(); },
      &value_));
  return *value_;
}

void CallResult::OnReady(std::function<void()> callback) {
  {
    absl::MutexLock lock(&mu_);
    if (!value_.has_value()) {
      callbacks_.push_back(std::move(callback));
      return;
    }
  }
  callback();
}

absl::StatusOr<std::shared_ptr<const EncodedInput>> EncodeInput(const DataProto& input) {
  absl::StatusOr<DetachedWire> wire = ToDetachedWire(input);
  if (!wire.ok()) return wire.status();
  return std::make_shared<const EncodedInput>(std::move(wire).value());
}

WorkerClient::WorkerClient(int rank, std::string address,
                           std::function<void(absl::Status)> on_session_lost)
    : rank_(rank), address_(std::move(address)), on_session_lost_(std::move(on_session_lost)) {}

WorkerClient::~WorkerClient() { Close(); }

absl::Status WorkerClient::Open() {
  channel_ = CreateDrayChannel(address_);
  if (!channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + kConnectTimeout))) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to worker rank ", rank_, " at ", address_));
  }
  // The session carries raw byte buffers (session_stream.h); gRPC's sync API
  // opens such a stream the way its generated stubs open typed ones.
  const grpc::internal::RpcMethod session(SessionMethodName(),
                                          grpc::internal::RpcMethod::BIDI_STREAMING, channel_);
  stream_.reset(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel_.get(), session, &context_));
  writer_ = std::thread(&WorkerClient::WriteLoop, this);
  reader_ = std::thread(&WorkerClient::ReadLoop, this);
  watchdog_ = std::thread(&WorkerClient::WatchDeadlines, this);
  return absl::OkStatus();
}

CallFuture WorkerClient::Submit(std::string role, std::string method,
                                std::shared_ptr<const EncodedInput> input, absl::Time deadline) {
  Outgoing call;
  CallFuture future;
  {
    absl::MutexLock lock(&mu_);
    if (failed_.has_value()) return Ready(*failed_);
    if (closing_ || stream_ == nullptr) {
      return Ready(
          absl::FailedPreconditionError(absl::StrCat("worker rank ", rank_, " is not connected")));
    }
    call = {next_call_id_++, std::move(role), std::move(method), std::move(input), deadline};
    Pending& pending = pending_[call.call_id];
    pending.result = std::make_shared<CallResult>();
    pending.method = call.method;
    pending.deadline = deadline;
    future = pending.result;
    ++submitted_;
    // A small call to an idle worker is written on this thread, which saves
    // the hand-off to the writer: an idle worker is reading, so the write
    // cannot wait on flow control. Anything else queues for the writer.
    const bool idle = pending_.size() == 1 && outgoing_.empty() && !writing_;
    if (!idle || call.input->payload.size > kInlinePayloadBytes) {
      outgoing_.push_back(std::move(call));
      return future;
    }
    writing_ = true;
  }
  WriteCall(call);  // if the stream broke, the reader reports why
  absl::MutexLock lock(&mu_);
  writing_ = false;
  return future;
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

void WorkerClient::Fail(absl::Status status) {
  std::map<uint64_t, Pending> failed_calls;
  {
    absl::MutexLock lock(&mu_);
    if (!failed_.has_value()) failed_ = status;
    failed_calls.swap(pending_);
    outgoing_.clear();
    status = *failed_;
  }
  for (auto& [call_id, pending] : failed_calls) pending.result->Set(status);
  context_.TryCancel();
}

bool WorkerClient::WriteCall(const Outgoing& call) {
  v1::CallRequest request;
  request.set_role(call.role);
  request.set_method(call.method);
  request.set_call_id(call.call_id);
  request.set_deadline_unix_ms(absl::ToUnixMillis(call.deadline));
  *request.mutable_input() = call.input->header;
  return WriteCallRequest(stream_.get(), std::move(request), call.input->payload);
}

void WorkerClient::WriteLoop() {
  while (true) {
    Outgoing call;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkerClient* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return (!self->outgoing_.empty() && !self->writing_) || self->closing_ ||
                   self->failed_.has_value();
          },
          this));
      if (closing_ || failed_.has_value()) break;
      call = std::move(outgoing_.front());
      outgoing_.pop_front();
      if (pending_.count(call.call_id) == 0) continue;  // its deadline passed while queued
      writing_ = true;
    }
    const bool written = WriteCall(call);
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!written) break;  // the reader reports why
  }
}

void WorkerClient::ReadLoop() {
  absl::Status ended = absl::OkStatus();
  while (true) {
    absl::StatusOr<std::optional<v1::CallResponse>> next = ReadCallResponse(stream_.get());
    if (!next.ok()) ended = next.status();
    if (!next.ok() || !next->has_value()) break;
    v1::CallResponse& response = **next;
    if (response.has_error()) {
      Resolve(response.call_id(),
              absl::Status(static_cast<absl::StatusCode>(response.error().code()),
                           response.error().message()));
      continue;
    }
    absl::StatusOr<DataProto> result = FromWire(std::move(*response.mutable_result()));
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
  const absl::Status lost = absl::UnavailableError(
      absl::StrCat("the session with worker rank ", rank_, " at ", address_, " ended",
                   ended.ok() ? "" : absl::StrCat(": ", ended.message())));
  if (on_session_lost_) on_session_lost_(lost);
  Fail(lost);
}

void WorkerClient::WatchDeadlines() {
  absl::MutexLock lock(&mu_);
  while (!closing_) {
    absl::Time earliest = absl::InfiniteFuture();
    for (const auto& [call_id, pending] : pending_) earliest = std::min(earliest, pending.deadline);
    // Wake at the earliest deadline, or when a new call may bring an earlier one.
    const uint64_t seen = submitted_;
    auto woken = [this, seen]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closing_ || submitted_ != seen; };
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
    outgoing_.clear();
  }
  for (auto& [call_id, pending] : cancelled) {
    pending.result->Set(absl::CancelledError(absl::StrCat(
        "call '", pending.method, "' on worker rank ", rank_, ": the group shut down")));
  }
  context_.TryCancel();
  for (std::thread* thread : {&writer_, &reader_, &watchdog_}) {
    if (thread->joinable()) thread->join();
  }
  {
    absl::MutexLock lock(&mu_);  // a caller may still be writing its call
    mu_.Await(absl::Condition(
        +[](bool* writing) { return !*writing; }, &writing_));
  }
  // Only now, with no reader or writer left, may the stream be finished.
  if (stream_ != nullptr) stream_->Finish();
}

}  // namespace dray
