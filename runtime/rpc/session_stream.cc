#include "runtime/rpc/session_stream.h"

#include <google/protobuf/io/coded_stream.h>
#include <grpcpp/support/slice.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "dispatch/payload_stream.h"
#include "dray/v1/worker.grpc.pb.h"

namespace dray {
namespace {

// Protobuf tag of a length-delimited `payload_chunk` (field 2) of either frame.
constexpr uint8_t kChunkTag = (2 << 3) | 2;
constexpr size_t kMaxVarintBytes = 10;

// SharedSlice: a slice over `bytes`[offset, offset + size) that shares them
// while gRPC holds it.
grpc::Slice SharedSlice(const Bytes& bytes, size_t offset, size_t size) {
  return grpc::Slice(
      const_cast<char*>(bytes.data() + offset), size,
      [](void* owner) { delete static_cast<Bytes*>(owner); }, new Bytes(bytes));
}

// ChunkFrames cuts `payload` into `payload_chunk` frames of at most
// kDefaultChunkBytes, built around the pieces without copying them.
std::vector<grpc::ByteBuffer> ChunkFrames(const ScatteredPayload& payload) {
  std::vector<grpc::ByteBuffer> frames;
  std::vector<grpc::Slice> slices;
  size_t piece = 0, offset = 0;  // where the next chunk starts
  for (uint64_t sent = 0; sent < payload.size;) {
    const size_t size = std::min<uint64_t>(kDefaultChunkBytes, payload.size - sent);
    uint8_t prefix[1 + kMaxVarintBytes] = {kChunkTag};
    const uint8_t* end =
        google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(size, prefix + 1);
    slices.assign({grpc::Slice(prefix, end - prefix)});
    for (size_t left = size; left > 0;) {
      const Bytes& bytes = payload.pieces[piece];
      const size_t n = std::min(left, bytes.size() - offset);
      if (n > 0) slices.push_back(SharedSlice(bytes, offset, n));
      left -= n;
      offset += n;
      if (offset == bytes.size()) ++piece, offset = 0;
    }
    frames.emplace_back(slices.data(), slices.size());
    sent += size;
  }
  return frames;
}

// Extents: a payload's place in shared memory, as its header names it.
using Extents = google::protobuf::RepeatedPtrField<v1::SegmentExtent>;

// AddExtent appends `size` bytes at `offset` of segment `number`, merged
// with the last extent when they follow it.
void AddExtent(uint64_t number, uint64_t offset, uint64_t size, Extents* extents) {
  if (size == 0) return;
  if (!extents->empty()) {
    v1::SegmentExtent& last = *extents->rbegin();
    if (last.segment() == number && last.offset() + last.size() == offset) {
      last.set_size(last.size() + size);
      return;
    }
  }
  v1::SegmentExtent* extent = extents->Add();
  extent->set_segment(number);
  extent->set_offset(offset);
  extent->set_size(size);
}

// ShareWithHandBacks puts `payload`, some of whose pieces lie in segments
// the peer passed (`places`, by piece), in shared memory: those go back by
// number; the rest is copied into one new segment, each piece as aligned
// (mod 64) as in the payload, so that tensors still alias it.
absl::StatusOr<Extents> ShareWithHandBacks(
    const ScatteredPayload& payload,
    const std::vector<std::optional<SegmentPassage::Place>>& places, SegmentPassage* segments) {
  static const Bytes kZeros(std::string(64, '\0'));
  ScatteredPayload own;
  std::vector<uint64_t> own_offsets(payload.pieces.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < payload.pieces.size(); ++i) {
    const Bytes& piece = payload.pieces[i];
    if (!places[i].has_value() && !piece.empty()) {
      const uint64_t padding = (offset - own.size) % 64;
      if (padding > 0) own.pieces.push_back(kZeros.Part(kZeros.view().substr(0, padding)));
      own_offsets[i] = own.size + padding;
      own.pieces.push_back(piece);
      own.size += padding + piece.size();
    }
    offset += piece.size();
  }
  uint64_t own_number = 0;
  if (own.size > 0) {
    DRAY_ASSIGN_OR_RETURN(std::shared_ptr<const Segment> segment, Segment::Write(own));
    DRAY_ASSIGN_OR_RETURN(own_number, segments->Send(std::move(segment)));
  }
  std::map<uint64_t, uint64_t> handed_back;  // the peer's segment -> its number now
  Extents extents;
  for (size_t i = 0; i < payload.pieces.size(); ++i) {
    const uint64_t size = payload.pieces[i].size();
    if (!places[i].has_value()) {
      AddExtent(own_number, own_offsets[i], size, &extents);
      continue;
    }
    auto [back, fresh] = handed_back.try_emplace(places[i]->segment, 0);
    if (fresh) {
      DRAY_ASSIGN_OR_RETURN(back->second, segments->HandBack(places[i]->segment));
    }
    AddExtent(back->second, places[i]->offset, size, &extents);
  }
  return extents;
}

// Share puts `payload` in shared memory through `segments` and returns its
// extents: pieces that lie in segments the peer passed go back by number
// (a result carrying rows of its input); otherwise the payload is copied
// into one segment (`shared`'s, when given).
absl::StatusOr<Extents> Share(const ScatteredPayload& payload, SegmentPassage* segments,
                              SharedSegment* shared) {
  std::vector<std::optional<SegmentPassage::Place>> places;
  bool any_placed = false;
  for (const Bytes& piece : payload.pieces) {
    places.push_back(piece.size() >= kReferencedRowBytes ? segments->Locate(piece) : std::nullopt);
    any_placed |= places.back().has_value();
  }
  if (any_placed) return ShareWithHandBacks(payload, places, segments);
  DRAY_ASSIGN_OR_RETURN(std::shared_ptr<const Segment> segment,
                        shared != nullptr ? shared->Get(payload) : Segment::Write(payload));
  DRAY_ASSIGN_OR_RETURN(uint64_t number, segments->Send(std::move(segment)));
  Extents extents;
  AddExtent(number, 0, payload.size, &extents);
  return extents;
}

// WriteMessage writes `frame`, whose DataProto `message` had its payload
// detached into `payload`: inline when small, through `segments` when large
// and there is a passage, else (or when the passage fails: out of memory,
// its peer gone) as chunk frames after it.
template <typename Frame>
bool WriteMessage(SessionWriter* writer, const Frame& frame, v1::DataProto* message,
                  const ScatteredPayload& payload, SegmentPassage* segments,
                  SharedSegment* shared = nullptr) {
  bool follows = false;  // as chunk frames
  if (message != nullptr) {
    message->set_payload_size(payload.size);
    if (payload.size <= kInlinePayloadBytes) {
      message->set_payload(payload.Flatten());
    } else if (segments != nullptr && payload.size >= kSharedPayloadBytes &&
               segments->connected()) {
      absl::StatusOr<Extents> extents = Share(payload, segments, shared);
      if (extents.ok()) {
        *message->mutable_shared_extents() = std::move(extents).value();
      } else {
        follows = true;
      }
    } else {
      follows = true;
    }
  }
  grpc::ByteBuffer header;
  bool own_buffer = false;
  if (!grpc::SerializationTraits<Frame>::Serialize(frame, &header, &own_buffer).ok()) return false;
  if (!writer->Write(header)) return false;
  if (!follows) return true;
  for (const grpc::ByteBuffer& chunk : ChunkFrames(payload)) {
    if (!writer->Write(chunk)) return false;
  }
  return true;
}

// ChunkBytes: the bytes of a received frame, walked across the transport's slices.
class ChunkBytes {
 public:
  explicit ChunkBytes(std::vector<grpc::Slice> slices) : slices_(std::move(slices)) {}

  // ReadPrefix parses the frame's tag and length (at most 11 bytes).
  absl::Status ReadPrefix(uint64_t* length) {
    uint8_t prefix[1 + kMaxVarintBytes];
    const size_t copied = Take(prefix, sizeof(prefix));
    if (copied == 0 || prefix[0] != kChunkTag) {
      return absl::InvalidArgumentError(
          "session: expected a payload chunk frame, got another frame inside a payload");
    }
    google::protobuf::io::CodedInputStream input(prefix + 1, static_cast<int>(copied - 1));
    if (!input.ReadVarint64(length)) {
      return absl::InvalidArgumentError("session: a payload chunk frame has a malformed length");
    }
    Rewind(copied - 1 - input.CurrentPosition());  // give back what the varint did not use
    return absl::OkStatus();
  }

  // AppendRest adds every byte after the prefix to `assembler`; the frame's
  // announced `length` must be exactly what is left.
  absl::Status AppendRest(uint64_t length, PayloadAssembler* assembler) {
    if (Remaining() != length) {
      return absl::InvalidArgumentError(absl::StrCat("session: a payload chunk frame announces ",
                                                     length, " bytes and carries ", Remaining()));
    }
    for (; slice_ < slices_.size(); ++slice_, offset_ = 0) {
      const grpc::Slice& slice = slices_[slice_];
      absl::Status added = assembler->Add(absl::string_view(
          reinterpret_cast<const char*>(slice.begin()) + offset_, slice.size() - offset_));
      if (!added.ok()) return added;
    }
    return absl::OkStatus();
  }

 private:
  // Take copies up to `count` bytes out, advancing the cursor.
  size_t Take(uint8_t* out, size_t count) {
    size_t taken = 0;
    for (; taken < count && slice_ < slices_.size();) {
      const grpc::Slice& slice = slices_[slice_];
      const size_t n = std::min(count - taken, slice.size() - offset_);
      std::copy_n(slice.begin() + offset_, n, out + taken);
      taken += n;
      offset_ += n;
      if (offset_ == slice.size()) ++slice_, offset_ = 0;
    }
    return taken;
  }

  // Rewind moves the cursor back `count` bytes.
  void Rewind(size_t count) {
    while (count > 0) {
      if (offset_ == 0) offset_ = slices_[--slice_].size();
      const size_t n = std::min(count, offset_);
      offset_ -= n;
      count -= n;
    }
  }

  uint64_t Remaining() const {
    uint64_t remaining = 0;
    for (size_t i = slice_; i < slices_.size(); ++i) remaining += slices_[i].size();
    return remaining - offset_;
  }

  std::vector<grpc::Slice> slices_;
  size_t slice_ = 0;   // current slice
  size_t offset_ = 0;  // within it
};

// ReadChunks fills `message`'s detached payload from the chunk frames that follow its header.
absl::Status ReadChunks(SessionReader* reader, v1::DataProto* message) {
  if (message->payload().size() == message->payload_size()) return absl::OkStatus();  // inline
  if (!message->payload().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("session: a header carries ", message->payload().size(), " of its ",
                     message->payload_size(), " payload bytes inline"));
  }
  PayloadAssembler assembler({message});
  grpc::ByteBuffer frame;
  while (assembler.received_bytes() < assembler.expected_bytes()) {
    if (!reader->Read(&frame)) {
      return absl::UnavailableError(absl::StrCat("session ended after ", assembler.received_bytes(),
                                                 " of ", assembler.expected_bytes(),
                                                 " payload bytes"));
    }
    std::vector<grpc::Slice> slices;
    if (!frame.Dump(&slices).ok())
      return absl::InternalError("session: cannot read a frame's bytes");
    ChunkBytes chunk(std::move(slices));
    uint64_t length = 0;
    absl::Status status = chunk.ReadPrefix(&length);
    if (status.ok()) status = chunk.AppendRest(length, &assembler);
    if (!status.ok()) return status;
  }
  return assembler.Finish();
}

// ReceiveExtents maps the segments `message`'s extents name and returns
// the payload as those extents.
absl::StatusOr<ScatteredPayload> ReceiveExtents(const v1::DataProto& message,
                                                SegmentPassage* segments) {
  std::map<uint64_t, uint64_t> needed;  // bytes of each segment
  for (const v1::SegmentExtent& extent : message.shared_extents()) {
    if (extent.size() > UINT64_MAX - extent.offset()) {
      return absl::InvalidArgumentError("session: a shared-memory extent overflows");
    }
    needed[extent.segment()] = std::max(needed[extent.segment()], extent.offset() + extent.size());
  }
  std::map<uint64_t, Bytes> mapped;
  for (const auto& [number, size] : needed) {
    DRAY_ASSIGN_OR_RETURN(mapped[number], segments->Receive(number, size));
  }
  ScatteredPayload payload;
  for (const v1::SegmentExtent& extent : message.shared_extents()) {
    const Bytes& segment = mapped[extent.segment()];
    payload.pieces.push_back(segment.Part(segment.view().substr(extent.offset(), extent.size())));
    payload.size += extent.size();
  }
  if (payload.size != message.payload_size()) {
    return absl::InvalidArgumentError(absl::StrCat("session: shared-memory extents of ",
                                                   payload.size, " bytes for a payload of ",
                                                   message.payload_size()));
  }
  return payload;
}

// ReadPayload returns `message`'s payload: inline, from the segments it
// names, or from the chunk frames that follow its header.
absl::StatusOr<ScatteredPayload> ReadPayload(SessionReader* reader, v1::DataProto* message,
                                             SegmentPassage* segments) {
  if (!message->shared_extents().empty()) {
    if (segments == nullptr) {
      return absl::InvalidArgumentError(
          "session: a header names shared-memory segments, but this session has no passage");
    }
    return ReceiveExtents(*message, segments);
  }
  DRAY_RETURN_IF_ERROR(ReadChunks(reader, message));
  return ScatteredPayload::Whole(Bytes(std::move(*message->mutable_payload())));
}

// IsProgress hands a progress frame to `on_progress` (a response frame on a
// reader that takes progress); false for any other frame.
bool IsProgress(const v1::CallRequestFrame&, const ProgressHandler&) { return false; }
bool IsProgress(const v1::CallResponseFrame& frame, const ProgressHandler& on_progress) {
  if (frame.frame_case() != v1::CallResponseFrame::kProgress || !on_progress) return false;
  on_progress(frame.progress());
  return true;
}

// ReadMessage reads one header frame and the payload of its DataProto
// (`payload_of` picks it; null when the message has none).
template <typename Frame, typename Header, typename PayloadOf>
absl::StatusOr<std::optional<Received<Header>>> ReadMessage(SessionReader* reader,
                                                            PayloadOf payload_of,
                                                            const ProgressHandler& on_progress,
                                                            SegmentPassage* segments) {
  Frame frame;
  do {
    grpc::ByteBuffer bytes;
    if (!reader->Read(&bytes)) return std::optional<Received<Header>>();
    if (!grpc::SerializationTraits<Frame>::Deserialize(&bytes, &frame).ok()) {
      return absl::InvalidArgumentError("session: a frame is not a valid protobuf message");
    }
  } while (IsProgress(frame, on_progress));
  if (frame.frame_case() != Frame::kHeader) {
    return absl::InvalidArgumentError("session: expected a header frame, got another");
  }
  Received<Header> received{std::move(*frame.mutable_header()), ScatteredPayload()};
  if (v1::DataProto* message = payload_of(received.header); message != nullptr) {
    DRAY_ASSIGN_OR_RETURN(received.payload, ReadPayload(reader, message, segments));
  }
  return std::optional<Received<Header>>(std::move(received));
}

}  // namespace

const char* SessionMethodName() {
  static const std::string* name =
      new std::string(absl::StrCat("/", v1::WorkerService::service_full_name(), "/Session"));
  return name->c_str();
}

bool WriteCallRequest(SessionWriter* writer, v1::CallRequest request,
                      const ScatteredPayload& payload, SegmentPassage* segments,
                      SharedSegment* shared) {
  v1::CallRequestFrame frame;
  *frame.mutable_header() = std::move(request);
  return WriteMessage(writer, frame, frame.mutable_header()->mutable_input(), payload, segments,
                      shared);
}

bool WriteCallResponse(SessionWriter* writer, v1::CallResponse response,
                       const ScatteredPayload& payload, SegmentPassage* segments) {
  v1::CallResponseFrame frame;
  *frame.mutable_header() = std::move(response);
  v1::CallResponse* header = frame.mutable_header();
  return WriteMessage(writer, frame, header->has_result() ? header->mutable_result() : nullptr,
                      payload, segments);
}

absl::StatusOr<std::optional<Received<v1::CallRequest>>> ReadCallRequest(SessionReader* reader,
                                                                         SegmentPassage* segments) {
  return ReadMessage<v1::CallRequestFrame, v1::CallRequest>(
      reader, [](v1::CallRequest& request) { return request.mutable_input(); }, nullptr, segments);
}

bool WriteCallProgress(SessionWriter* writer, v1::CallProgress progress) {
  v1::CallResponseFrame frame;
  *frame.mutable_progress() = std::move(progress);
  grpc::ByteBuffer bytes;
  bool own_buffer = false;
  return grpc::SerializationTraits<v1::CallResponseFrame>::Serialize(frame, &bytes, &own_buffer)
             .ok() &&
         writer->Write(bytes);
}

absl::StatusOr<std::optional<Received<v1::CallResponse>>> ReadCallResponse(
    SessionReader* reader, const ProgressHandler& on_progress, SegmentPassage* segments) {
  return ReadMessage<v1::CallResponseFrame, v1::CallResponse>(
      reader,
      [](v1::CallResponse& response) {
        return response.has_result() ? response.mutable_result() : nullptr;
      },
      on_progress, segments);
}

}  // namespace dray
