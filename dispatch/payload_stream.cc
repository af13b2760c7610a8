#include "dispatch/payload_stream.h"

#include <unistd.h>

#include <algorithm>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dray {
namespace {

// ReserveFor makes room for `message`'s announced payload in one allocation.
// Reserved pages cost nothing until written, so a header that announces more
// than it sends is harmless; an announcement beyond physical memory is capped.
absl::Status ReserveFor(v1::DataProto* message) {
  const uint64_t physical = uint64_t{static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES))} *
                            static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  try {
    message->mutable_payload()->reserve(std::min(message->payload_size(), physical));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", message->payload_size(), " bytes for a streamed payload"));
  }
  return absl::OkStatus();
}

}  // namespace

PayloadAssembler::PayloadAssembler(std::vector<v1::DataProto*> messages)
    : messages_(std::move(messages)) {
  for (v1::DataProto* message : messages_) {
    message->clear_payload();
    expected_bytes_ += message->payload_size();
  }
}

absl::Status PayloadAssembler::Add(absl::string_view chunk) {
  while (!chunk.empty()) {
    while (current_ < messages_.size() &&
           messages_[current_]->payload().size() == messages_[current_]->payload_size()) {
      ++current_;
    }
    if (current_ == messages_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("stream carried more payload bytes than the ",
                                                     expected_bytes_, " its header announced"));
    }
    v1::DataProto* message = messages_[current_];
    if (message->payload().empty()) {
      absl::Status reserved = ReserveFor(message);
      if (!reserved.ok()) return reserved;
    }
    const size_t take =
        std::min<uint64_t>(chunk.size(), message->payload_size() - message->payload().size());
    message->mutable_payload()->append(chunk.data(), take);
    received_bytes_ += take;
    chunk.remove_prefix(take);
  }
  return absl::OkStatus();
}

absl::Status PayloadAssembler::Finish() const {
  if (received_bytes_ != expected_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("stream ended after ", received_bytes_, " of ",
                                                   expected_bytes_, " announced payload bytes"));
  }
  return absl::OkStatus();
}

}  // namespace dray
