// Framing of one message on a WorkerService.Session stream, shared by the
// controller (writing CallRequestFrames) and the worker (CallResponseFrames):
// a header frame whose DataProto has its payload detached, then the payload
// as chunk frames of at most kDefaultChunkBytes.
//
// Thread-safety: a stream must be written by one thread at a time; these
// helpers add no locking.
#ifndef DRAY_RUNTIME_SESSION_FRAMES_H_
#define DRAY_RUNTIME_SESSION_FRAMES_H_

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "dispatch/payload_stream.h"
#include "dray/v1/data.pb.h"

namespace dray {

// WriteFramed writes `header` and then `payload` in chunks; false when the
// stream broke.
template <typename Frame, typename Writer>
bool WriteFramed(Writer* writer, const Frame& header, absl::string_view payload) {
  if (!writer->Write(header)) return false;
  Frame chunk;
  for (absl::string_view piece : PayloadChunks(payload)) {
    chunk.set_payload_chunk(piece.data(), piece.size());
    if (!writer->Write(chunk)) return false;
  }
  return true;
}

// ReadPayload reads the chunk frames that refill `message`'s detached payload.
template <typename Frame, typename Reader>
absl::Status ReadPayload(Reader* reader, v1::DataProto* message) {
  PayloadAssembler assembler({message});
  Frame frame;
  while (assembler.received_bytes() < assembler.expected_bytes()) {
    if (!reader->Read(&frame)) {
      return absl::UnavailableError(absl::StrCat("session ended after ", assembler.received_bytes(),
                                                 " of ", assembler.expected_bytes(),
                                                 " payload bytes"));
    }
    if (frame.frame_case() != Frame::kPayloadChunk) {
      return absl::InvalidArgumentError("session: a header frame arrived inside a payload");
    }
    absl::Status added = assembler.Add(frame.payload_chunk());
    if (!added.ok()) return added;
  }
  return assembler.Finish();
}

}  // namespace dray

#endif  // DRAY_RUNTIME_SESSION_FRAMES_H_
