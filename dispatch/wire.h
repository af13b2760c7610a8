// Conversion between DataProto and its wire form, dray.v1.DataProto.
//
// ToWire copies every tensor and byte row once, into one payload whose
// buffers start at 64-byte aligned offsets. ToDetachedWire lays out the same
// payload as pieces for a sender that writes scattered memory: large images
// and byte rows (immutable) stay where they are, only the rest is copied;
// tensors are always copied, since their owner may change them in place
// before the bytes are sent. Decoding takes the message's
// payload by move and builds tensors that alias it: nothing is copied unless
// a buffer is misaligned for its element type (possible only from foreign
// encoders); image and byte rows alias it too. The conversion is exact for
// every dtype: bytes in, same bytes out.
//
//   DRAY_ASSIGN_OR_RETURN(dray::v1::DataProto message, ToWire(batch));
//   ...send, receive...
//   DRAY_ASSIGN_OR_RETURN(DataProto decoded, FromWire(std::move(message)));
//
// FromWire validates everything it reads and returns INVALID_ARGUMENT naming
// the column, row and sizes at fault: unknown dtype, byte count that does not
// match the shape, buffers outside the payload, inconsistent batch sizes,
// duplicate columns, malformed raw images. It never crashes on bad input.
//
// Thread-safety: stateless functions, safe to call concurrently.
#ifndef DRAY_DISPATCH_WIRE_H_
#define DRAY_DISPATCH_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dispatch/data_proto.h"
#include "dray/v1/data.pb.h"

namespace dray {

// ToWire encodes `data` with its payload inline. Tensors on other devices are
// copied to the CPU; dtypes outside dray.v1.DType (complex, ...) are an error.
absl::StatusOr<v1::DataProto> ToWire(const DataProto& data);

// Images and byte rows of at least this size are referenced by ToDetachedWire.
inline constexpr size_t kReferencedRowBytes = size_t{16} << 10;

// ScatteredPayload: a payload as the pieces it is made of, in order.
struct ScatteredPayload {
  std::vector<Bytes> pieces;
  uint64_t size = 0;  // of all pieces together

  // Whole: `bytes` as a payload of one piece.
  static ScatteredPayload Whole(Bytes bytes);

  // Flatten copies the pieces into one string.
  std::string Flatten() const;
};

// DetachedWire: a DataProto in wire form whose payload is detached (the
// header's payload is empty, its payload_size set) and scattered.
struct DetachedWire {
  v1::DataProto header;
  ScatteredPayload payload;
};

// ToDetachedWire encodes `data` as ToWire does, copying only what must be
// copied (see the file comment); the pieces keep what they reference alive.
absl::StatusOr<DetachedWire> ToDetachedWire(const DataProto& data);

// FromWire decodes `message`, whose payload must be inline (attach a streamed
// payload first, see payload_stream.h).
absl::StatusOr<DataProto> FromWire(v1::DataProto message);

// FromWire decodes `message` (its own payload field unused) with `payload`
// from elsewhere: chunks assembled after it (one piece), or extents of
// shared-memory segments. Each buffer must lie within one piece, which the
// result aliases.
absl::StatusOr<DataProto> FromWire(const v1::DataProto& message, const ScatteredPayload& payload);

// EncodeTensor appends `tensor`'s bytes to `payload` at a 64-byte aligned
// offset and returns its descriptor. Any rank works, 0-d included.
absl::StatusOr<v1::Tensor> EncodeTensor(const at::Tensor& tensor, std::string* payload);

// DecodeTensor reads a tensor from `payload`; `where` names it in errors. The
// result aliases (and keeps alive) `payload`.
absl::StatusOr<at::Tensor> DecodeTensor(const v1::Tensor& message, const Bytes& payload,
                                        absl::string_view where);

}  // namespace dray

#endif  // DRAY_DISPATCH_WIRE_H_
