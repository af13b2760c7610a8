// The WorkerService.Session wire (see worker.proto), read and written as raw
// gRPC byte buffers: a streamed payload's rows are not copied on their way
// out (tensors are, see wire.h) and the payload is copied once on its way
// in, straight into the buffer its tensors will alias; in shared memory it
// is copied once on its way out and not at all on its way in.
//
// A message (a call, or its response) is one header frame, a serialized
// CallRequestFrame or CallResponseFrame with `header` set. A payload of at
// most kInlinePayloadBytes travels inside it, so a small call is one frame
// each way; a larger one is detached (payload_size announces it) and follows
// as `payload_chunk` frames of at most kDefaultChunkBytes, which dray builds
// around the payload's pieces where they lie (wire.h: ToDetachedWire) -
// unless both ends share a node and a SegmentPassage, which carries payloads
// of kSharedPayloadBytes or more in shared memory (the header names its
// extents: a new segment, and segments of the receiver's own that the
// payload's rows already lie in, handed back). The frames are ordinary protobuf messages of
// worker.proto, so any gRPC client can speak the protocol.
//
//   DRAY_ASSIGN_OR_RETURN(DetachedWire input, ToDetachedWire(batch));
//   v1::CallRequest request = ...;
//   *request.mutable_input() = input.header;
//   if (!WriteCallRequest(stream, std::move(request), input.payload)) ...;  // broken
//   absl::StatusOr<std::optional<Received<v1::CallResponse>>> response = ReadCallResponse(stream);
//   FromWire(response->header.result(), response->payload) ...
//
// Thread-safety: a stream may be read by one thread while another writes it;
// two threads must not both read, or both write.
#ifndef DRAY_RUNTIME_RPC_SESSION_STREAM_H_
#define DRAY_RUNTIME_RPC_SESSION_STREAM_H_

#include <cstddef>
#include <functional>
#include <optional>

#include <grpcpp/support/byte_buffer.h>

#include "absl/status/statusor.h"
#include "dispatch/wire.h"
#include "dray/v1/worker.pb.h"
#include "runtime/transport/segment_passage.h"

namespace dray {

// Payloads up to this size travel inside their header frame.
inline constexpr size_t kInlinePayloadBytes = size_t{64} << 10;

// The full gRPC method name of WorkerService.Session.
const char* SessionMethodName();

// Metadata of a Session whose client holds the worker's SegmentPassage: only
// such a session gets large results in shared memory.
inline constexpr char kSharedMemoryMetadata[] = "dray-shared-memory";

// SessionReader: where a Session's frames come from, one at a time.
class SessionReader {
 public:
  virtual ~SessionReader() = default;
  // Read waits for the next frame; false when the stream ended or broke.
  virtual bool Read(grpc::ByteBuffer* frame) = 0;
};

// SessionWriter: where a Session's frames go, one at a time.
class SessionWriter {
 public:
  virtual ~SessionWriter() = default;
  // Write sends `frame` (the transport may share its slices until sent);
  // false when the stream broke.
  virtual bool Write(const grpc::ByteBuffer& frame) = 0;
};

// ClientSession: the controller's end of a session, over gRPC (RawBidiCall)
// or a socket of the node (SocketSession).
class ClientSession : public SessionReader, public SessionWriter {
 public:
  // Cancel breaks the session: a pending read fails, and so do later ones.
  virtual void Cancel() = 0;
  // Finish returns how the worker ended the session (OK when it did, or the
  // cancellation) once reads are over: call it from the reading thread, or
  // after it stopped.
  virtual absl::Status Finish() = 0;
};

// Received: a message read from a session, and the payload of its DataProto
// (empty when it has none; in pieces when it lies in shared-memory
// extents), which FromWire(message, payload) decodes.
template <typename Header>
struct Received {
  Header header;
  ScatteredPayload payload;
};

// WriteCallRequest writes `request`, whose input's payload was detached into
// `payload`, a large one through `segments` when given (in `shared`'s
// segment, when the same payload goes to several workers and none of its
// rows is handed back); false when the
// stream broke. The transport may reference the payload's pieces (sharing
// them) until they are sent.
bool WriteCallRequest(SessionWriter* writer, v1::CallRequest request,
                      const ScatteredPayload& payload, SegmentPassage* segments = nullptr,
                      SharedSegment* shared = nullptr);

// WriteCallResponse writes `response`, whose result's payload (if it has a
// result) was detached into `payload`; false when the stream broke.
bool WriteCallResponse(SessionWriter* writer, v1::CallResponse response,
                       const ScatteredPayload& payload, SegmentPassage* segments = nullptr);

// ReadCallRequest reads the next call and its input's payload (from
// `segments` when the header names segments); nullopt when the stream
// ended between messages, INVALID_ARGUMENT for a malformed message,
// UNAVAILABLE for one cut short.
absl::StatusOr<std::optional<Received<v1::CallRequest>>> ReadCallRequest(
    SessionReader* reader, SegmentPassage* segments = nullptr);

// WriteCallProgress writes a progress frame of the running call; false when
// the stream broke.
bool WriteCallProgress(SessionWriter* writer, v1::CallProgress progress);

// ProgressHandler receives the progress frames that precede a response.
using ProgressHandler = std::function<void(const v1::CallProgress& progress)>;

// ReadCallResponse is ReadCallRequest for responses (payload of the result),
// handing the progress frames before it to `on_progress` (without one, a
// progress frame is INVALID_ARGUMENT).
absl::StatusOr<std::optional<Received<v1::CallResponse>>> ReadCallResponse(
    SessionReader* reader, const ProgressHandler& on_progress = nullptr,
    SegmentPassage* segments = nullptr);

}  // namespace dray

#endif  // DRAY_RUNTIME_RPC_SESSION_STREAM_H_
