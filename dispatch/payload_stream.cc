#include "dispatch/payload_stream.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dray {
namespace {

// Upfront reservation per payload; larger payloads grow as bytes arrive.
constexpr uint64_t kMaxReserveBytes = uint64_t{64} << 20;

}  // namespace

std::vector<std::string> DetachPayloads(const std::vector<v1::DataProto*>& messages) {
  std::vector<std::string> payloads;
  payloads.reserve(messages.size());
  for (v1::DataProto* message : messages) {
    message->set_payload_size(message->payload().size());
    payloads.push_back(std::move(*message->mutable_payload()));
    message->clear_payload();
  }
  return payloads;
}

std::vector<absl::string_view> PayloadChunks(const std::vector<std::string>& payloads,
                                             size_t chunk_bytes) {
  std::vector<absl::string_view> chunks;
  for (const std::string& payload : payloads) {
    for (size_t offset = 0; offset < payload.size(); offset += chunk_bytes) {
      chunks.emplace_back(payload.data() + offset, std::min(chunk_bytes, payload.size() - offset));
    }
  }
  return chunks;
}

PayloadAssembler::PayloadAssembler(std::vector<v1::DataProto*> messages)
    : messages_(std::move(messages)) {
  for (v1::DataProto* message : messages_) {
    message->clear_payload();
    message->mutable_payload()->reserve(std::min(message->payload_size(), kMaxReserveBytes));
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
      return absl::InvalidArgumentError(
          absl::StrCat("stream carried more payload bytes than the ", expected_bytes_,
                       " its header announced"));
    }
    v1::DataProto* message = messages_[current_];
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
