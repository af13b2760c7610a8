#include "runtime/rpc/raw_bidi_call.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/rpc/grpc_util.h"

namespace dray {

RawBidiCall::RawBidiCall(const std::shared_ptr<grpc::Channel>& channel) : stub_(channel) {}

absl::StatusOr<std::unique_ptr<RawBidiCall>> RawBidiCall::Start(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& method, absl::Time deadline,
    const Metadata& metadata) {
  std::unique_ptr<RawBidiCall> call(new RawBidiCall(channel));
  for (const auto& [key, value] : metadata) call->context_.AddMetadata(key, value);
  if (deadline != absl::InfiniteFuture()) call->context_.set_deadline(absl::ToChronoTime(deadline));
  call->stream_ = call->stub_.PrepareCall(&call->context_, method, &call->queue_);
  call->stream_->StartCall(&call->start_tag_);
  bool ok = false;
  call->Next(&ok);  // the only operation in flight: the start
  if (!ok) {
    absl::MutexLock lock(&call->mu_);
    call->broken_ = true;
    return absl::UnavailableError(absl::StrCat("cannot start ", method));
  }
  return call;
}

absl::Status RawBidiCall::Finish() {
  if (!final_status_.has_value()) {
    // Reads are over (the reading thread's last Read failed, or it stopped).
    DrainWrites();
    grpc::Status status;
    stream_->Finish(&status, &finish_tag_);
    bool ok;
    while (Next(&ok) != &finish_tag_) {
    }
    final_status_ = ToAbslStatus(status, "the stream");
  }
  return *final_status_;
}

RawBidiCall::~RawBidiCall() {
  if (stream_ != nullptr && !final_status_.has_value()) {
    context_.TryCancel();  // a stream still open ends here
    Finish().IgnoreError();
  }
  queue_.Shutdown();
  void* tag;
  bool ok;
  while (queue_.Next(&tag, &ok)) {
  }
}

bool RawBidiCall::Read(grpc::ByteBuffer* frame) {
  {
    absl::MutexLock lock(&mu_);
    if (broken_) return false;
  }
  stream_->Read(frame, &read_tag_);
  bool ok = false;
  while (Next(&ok) != &read_tag_) {
  }
  if (ok) return true;
  DrainWrites();
  return false;
}

bool RawBidiCall::Write(const grpc::ByteBuffer& frame) {
  absl::MutexLock lock(&mu_);
  if (broken_) return false;
  outgoing_.push_back(frame);
  if (!write_in_flight_) PostWrite();
  return true;
}

void RawBidiCall::PostWrite() {
  write_in_flight_ = true;
  stream_->Write(outgoing_.front(), &write_tag_);
}

void* RawBidiCall::Next(bool* ok) {
  void* tag = nullptr;
  if (!queue_.Next(&tag, ok)) return nullptr;
  if (tag == &write_tag_) {
    absl::MutexLock lock(&mu_);
    outgoing_.pop_front();
    write_in_flight_ = false;
    if (!*ok) broken_ = true;
    if (!broken_ && !outgoing_.empty()) PostWrite();
  }
  return tag;
}

void RawBidiCall::DrainWrites() {
  // The stream is over (a read failed): a write in flight completes soon.
  bool in_flight;
  {
    absl::MutexLock lock(&mu_);
    broken_ = true;
    in_flight = write_in_flight_;
  }
  bool ok;
  while (in_flight) {
    Next(&ok);
    absl::MutexLock lock(&mu_);
    in_flight = write_in_flight_;
  }
  absl::MutexLock lock(&mu_);
  outgoing_.clear();
}

}  // namespace dray
