// Reassembly of DataProto payloads that arrive in chunks, for batches larger
// than one gRPC message (which must stay under 2 GiB, and moves fastest in
// 1-4 MiB pieces).
//
// A message that holds DataProtos (a CallRequest, say) travels as one header
// frame with every payload detached (wire.h: ToDetachedWire), then the
// payloads' bytes as chunks, in the order the DataProtos were listed. The
// receiver refills them:
//
//   PayloadAssembler assembler({header.mutable_input()});
//   while (Read(&frame)) DRAY_RETURN_IF_ERROR(assembler.Add(frame.payload_chunk()));
//   DRAY_RETURN_IF_ERROR(assembler.Finish());  // payloads attached; FromWire works
//
// Each payload is allocated once, when its first byte arrives; pages are
// committed only as bytes are written, so a header that announces more than it
// sends costs no memory. Extra or missing bytes are errors.
//
// Thread-safety: PayloadAssembler is not thread-safe.
#ifndef DRAY_DISPATCH_PAYLOAD_STREAM_H_
#define DRAY_DISPATCH_PAYLOAD_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "dray/v1/data.pb.h"

namespace dray {

// kDefaultChunkBytes: chunk size for streamed payloads (2 MiB).
inline constexpr size_t kDefaultChunkBytes = size_t{2} << 20;

// PayloadAssembler refills the detached payloads of `messages` from chunks.
class PayloadAssembler {
 public:
  // The messages must outlive the assembler; their payload_size fields say
  // how many bytes each expects.
  explicit PayloadAssembler(std::vector<v1::DataProto*> messages);

  // Add appends a chunk; more bytes than announced is INVALID_ARGUMENT, an
  // announced size that cannot be allocated RESOURCE_EXHAUSTED.
  absl::Status Add(absl::string_view chunk);

  // Finish checks that every announced byte arrived (INVALID_ARGUMENT naming
  // the counts otherwise).
  absl::Status Finish() const;

  uint64_t expected_bytes() const { return expected_bytes_; }
  uint64_t received_bytes() const { return received_bytes_; }

 private:
  std::vector<v1::DataProto*> messages_;
  size_t current_ = 0;  // index of the message being filled
  uint64_t expected_bytes_ = 0;
  uint64_t received_bytes_ = 0;
};

}  // namespace dray

#endif  // DRAY_DISPATCH_PAYLOAD_STREAM_H_
