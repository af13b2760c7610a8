#include "dispatch/wire.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace dray {
namespace {

static_assert(ABSL_IS_LITTLE_ENDIAN, "dray's wire format is little-endian; so must the host be");

constexpr size_t kAlignment = 64;

struct DTypeEntry {
  v1::DType wire;
  at::ScalarType scalar;
};

constexpr DTypeEntry kDTypes[] = {
    {v1::DTYPE_BOOL, at::kBool},     {v1::DTYPE_UINT8, at::kByte},
    {v1::DTYPE_INT8, at::kChar},     {v1::DTYPE_INT16, at::kShort},
    {v1::DTYPE_INT32, at::kInt},     {v1::DTYPE_INT64, at::kLong},
    {v1::DTYPE_FLOAT16, at::kHalf},  {v1::DTYPE_BFLOAT16, at::kBFloat16},
    {v1::DTYPE_FLOAT32, at::kFloat}, {v1::DTYPE_FLOAT64, at::kDouble},
};

absl::StatusOr<v1::DType> WireDType(at::ScalarType scalar, absl::string_view where) {
  for (const DTypeEntry& entry : kDTypes) {
    if (entry.scalar == scalar) return entry.wire;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      where, " has dtype ", c10::toString(scalar),
      ", which dray.v1 cannot carry (bool, uint8, int8, int16, int32, int64, float16, bfloat16, "
      "float32, float64)"));
}

absl::StatusOr<at::ScalarType> ScalarTypeOf(int wire, absl::string_view where) {
  for (const DTypeEntry& entry : kDTypes) {
    if (entry.wire == wire) return entry.scalar;
  }
  return absl::InvalidArgumentError(absl::StrCat(where, " has unknown dtype ", wire));
}

constexpr char kZeros[kAlignment] = {};

// PayloadBuilder lays buffers out in a payload at kAlignment-aligned offsets.
// It copies bytes to the end of `*copied`; when referencing, it leaves large
// rows (Bytes, immutable) where they are instead, as pieces of their own.
class PayloadBuilder {
 public:
  PayloadBuilder(std::string* copied, bool reference_large_rows)
      : copied_(copied), reference_large_rows_(reference_large_rows), size_(copied->size()) {}

  // Copy places a copy of `bytes` and returns where it landed.
  v1::BufferRef Copy(absl::string_view bytes) {
    const v1::BufferRef ref = Align(bytes.size());
    AppendCopied(bytes);
    return ref;
  }

  // Add places `row`, referenced when large enough, copied otherwise.
  v1::BufferRef Add(const Bytes& row) {
    if (!reference_large_rows_ || row.size() < kReferencedRowBytes) return Copy(row.view());
    const v1::BufferRef ref = Align(row.size());
    pieces_.push_back({row, 0, 0});
    size_ += row.size();
    return ref;
  }

  uint64_t size() const { return size_; }

  // Pieces returns the payload in order; copied bytes alias `copied`, which
  // must hold what this builder copied.
  std::vector<Bytes> Pieces(const std::shared_ptr<const std::string>& copied) const {
    std::vector<Bytes> pieces;
    for (const Piece& piece : pieces_) {
      pieces.push_back(piece.referenced.empty()
                           ? Bytes::Alias(copied, absl::string_view(*copied).substr(
                                                      piece.begin, piece.end - piece.begin))
                           : piece.referenced);
    }
    return pieces;
  }

 private:
  // Piece: a referenced row, or the copied bytes [begin, end).
  struct Piece {
    Bytes referenced;
    size_t begin, end;
  };

  // Align pads to the next aligned offset and returns the ref of `size` bytes there.
  v1::BufferRef Align(size_t size) {
    AppendCopied(absl::string_view(kZeros, (kAlignment - size_ % kAlignment) % kAlignment));
    v1::BufferRef ref;
    ref.set_offset(size_);
    ref.set_size(size);
    return ref;
  }

  void AppendCopied(absl::string_view bytes) {
    if (bytes.empty()) return;
    if (pieces_.empty() || !pieces_.back().referenced.empty()) {
      pieces_.push_back({Bytes(), copied_->size(), copied_->size()});
    }
    copied_->append(bytes.data(), bytes.size());
    pieces_.back().end = copied_->size();
    size_ += bytes.size();
  }

  std::string* const copied_;
  const bool reference_large_rows_;
  uint64_t size_;
  std::vector<Piece> pieces_;
};

// PayloadView: a payload as the pieces it arrived in, at their offsets (one
// piece when it is contiguous). Every buffer must lie within one piece.
class PayloadView {
 public:
  explicit PayloadView(const Bytes& payload) : pieces_{{0, payload}}, size_(payload.size()) {}
  explicit PayloadView(const ScatteredPayload& payload) {
    for (const Bytes& piece : payload.pieces) {
      pieces_.push_back({size_, piece});
      size_ += piece.size();
    }
  }

  uint64_t size() const { return size_; }

  // Slice returns the bytes `ref` names, or an error when they fall outside
  // the payload or across two of its pieces.
  absl::StatusOr<Bytes> Slice(const v1::BufferRef& ref, absl::string_view where) const {
    if (ref.offset() > size_ || ref.size() > size_ - ref.offset()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " needs payload bytes [", ref.offset(),
                                                     ", +", ref.size(), ") but the payload has ",
                                                     size_, " bytes (truncated?)"));
    }
    if (pieces_.empty()) return Bytes();
    // The last piece that starts at or before the buffer.
    auto piece = std::upper_bound(
        pieces_.begin(), pieces_.end(), ref.offset(),
        [](uint64_t offset, const Piece& candidate) { return offset < candidate.offset; });
    --piece;
    const uint64_t within = ref.offset() - piece->offset;
    if (ref.size() > piece->bytes.size() - within) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " needs payload bytes [", ref.offset(), ", +", ref.size(),
                       ") which straddle two of the payload's pieces (its shared-memory extents)"));
    }
    return piece->bytes.Part(piece->bytes.view().substr(within, ref.size()));
  }

 private:
  struct Piece {
    uint64_t offset;
    Bytes bytes;
  };
  std::vector<Piece> pieces_;
  uint64_t size_ = 0;
};

// NumBytes returns numel(shape) * element_size, or an error for a negative
// dimension or a size that overflows.
absl::StatusOr<uint64_t> NumBytes(const google::protobuf::RepeatedField<int64_t>& shape,
                                  size_t element_size, absl::string_view where) {
  uint64_t bytes = element_size;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has negative dimension ", dim));
    }
    if (dim != 0 && bytes > std::numeric_limits<int64_t>::max() / static_cast<uint64_t>(dim)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has shape [", absl::StrJoin(shape, ", "), "], too large"));
    }
    bytes *= static_cast<uint64_t>(dim);
  }
  return bytes;
}

absl::Status CheckBoolBytes(absl::string_view bytes, absl::string_view where) {
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (static_cast<unsigned char>(bytes[i]) > 1) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": bool element ", i, " is ",
                                                     static_cast<int>(bytes[i]), ", not 0 or 1"));
    }
  }
  return absl::OkStatus();
}

v1::Image::Format WireImageFormat(Image::Format format) {
  switch (format) {
    case Image::Format::kPng:
      return v1::Image::FORMAT_PNG;
    case Image::Format::kJpeg:
      return v1::Image::FORMAT_JPEG;
    case Image::Format::kRaw:
      return v1::Image::FORMAT_RAW;
  }
  return v1::Image::FORMAT_UNSPECIFIED;
}

absl::StatusOr<Image> DecodeImage(const v1::Image& message, const PayloadView& payload,
                                  absl::string_view where) {
  Image image;
  switch (message.format()) {
    case v1::Image::FORMAT_PNG:
      image.format = Image::Format::kPng;
      break;
    case v1::Image::FORMAT_JPEG:
      image.format = Image::Format::kJpeg;
      break;
    case v1::Image::FORMAT_RAW:
      image.format = Image::Format::kRaw;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has unknown image format ", message.format()));
  }
  image.width = message.width();
  image.height = message.height();
  image.channels = message.channels();
  if (image.width < 0 || image.height < 0 || image.channels < 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, " has a negative image dimension"));
  }
  DRAY_ASSIGN_OR_RETURN(image.bytes, payload.Slice(message.data(), where));
  if (image.format == Image::Format::kRaw) {
    if (image.width == 0 || image.height == 0 || image.channels < 1 || image.channels > 4) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": raw image ", image.width, "x",
                                                     image.height, "x", image.channels,
                                                     " needs positive sizes and 1-4 channels"));
    }
    const uint64_t expected = uint64_t{static_cast<uint32_t>(image.width)} *
                              static_cast<uint32_t>(image.height) *
                              static_cast<uint32_t>(image.channels);
    if (image.bytes.size() != expected) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": raw image ", image.width, "x",
                                                     image.height, "x", image.channels, " needs ",
                                                     expected, " bytes, got ", image.bytes.size()));
    }
  }
  return image;
}

// CopiedBound returns an upper bound on the payload bytes encoding `data`
// copies, rows that will be referenced left out.
size_t CopiedBound(const DataProto& data, bool reference_large_rows) {
  auto row_bytes = [reference_large_rows](const Bytes& row) {
    return reference_large_rows && row.size() >= kReferencedRowBytes ? kAlignment
                                                                     : row.size() + kAlignment;
  };
  size_t bytes = 0;
  for (const auto& column : data.tensors()) bytes += column.second.nbytes() + kAlignment;
  for (const auto& column : data.non_tensors()) {
    if (const auto* rows = std::get_if<std::vector<Bytes>>(&column.second)) {
      for (const Bytes& row : *rows) bytes += row_bytes(row);
    } else if (const auto* images = std::get_if<std::vector<Image>>(&column.second)) {
      for (const Image& image : *images) bytes += row_bytes(image.bytes);
    }
  }
  return bytes;
}

void EncodeNonTensor(const NonTensorColumn& column, v1::NonTensorColumn* message,
                     PayloadBuilder* payload) {
  struct Encoder {
    v1::NonTensorColumn* message;
    PayloadBuilder* payload;
    void operator()(const std::vector<std::string>& rows) const {
      message->mutable_strings()->mutable_values()->Add(rows.begin(), rows.end());
    }
    void operator()(const std::vector<Bytes>& rows) const {
      auto* values = message->mutable_bytes()->mutable_values();
      for (const Bytes& row : rows) {
        *values->Add() = payload->Add(row);
      }
    }
    void operator()(const std::vector<Image>& rows) const {
      auto* values = message->mutable_images()->mutable_values();
      for (const Image& row : rows) {
        v1::Image* image = values->Add();
        image->set_format(WireImageFormat(row.format));
        image->set_width(row.width);
        image->set_height(row.height);
        image->set_channels(row.channels);
        *image->mutable_data() = payload->Add(row.bytes);
      }
    }
    void operator()(const std::vector<int64_t>& rows) const {
      message->mutable_ints()->mutable_values()->Add(rows.begin(), rows.end());
    }
    void operator()(const std::vector<double>& rows) const {
      message->mutable_doubles()->mutable_values()->Add(rows.begin(), rows.end());
    }
    void operator()(const std::vector<Json>& rows) const {
      for (const Json& row : rows) message->mutable_json()->add_values(row.text);
    }
  };
  std::visit(Encoder{message, payload}, column);
}

absl::StatusOr<NonTensorColumn> DecodeNonTensor(const v1::NonTensorColumn& message,
                                                const PayloadView& payload) {
  const std::string where = absl::StrCat("non-tensor column '", message.name(), "'");
  switch (message.rows_case()) {
    case v1::NonTensorColumn::kStrings:
      return std::vector<std::string>(message.strings().values().begin(),
                                      message.strings().values().end());
    case v1::NonTensorColumn::kBytes: {
      std::vector<Bytes> rows;
      for (int i = 0; i < message.bytes().values_size(); ++i) {
        DRAY_ASSIGN_OR_RETURN(
            Bytes row, payload.Slice(message.bytes().values(i), absl::StrCat(where, " row ", i)));
        rows.push_back(std::move(row));
      }
      return rows;
    }
    case v1::NonTensorColumn::kImages: {
      std::vector<Image> rows;
      for (int i = 0; i < message.images().values_size(); ++i) {
        DRAY_ASSIGN_OR_RETURN(Image image, DecodeImage(message.images().values(i), payload,
                                                       absl::StrCat(where, " row ", i)));
        rows.push_back(std::move(image));
      }
      return rows;
    }
    case v1::NonTensorColumn::kInts:
      return std::vector<int64_t>(message.ints().values().begin(), message.ints().values().end());
    case v1::NonTensorColumn::kDoubles:
      return std::vector<double>(message.doubles().values().begin(),
                                 message.doubles().values().end());
    case v1::NonTensorColumn::kJson: {
      std::vector<Json> rows;
      for (const std::string& text : message.json().values()) rows.push_back(Json{text});
      return rows;
    }
    case v1::NonTensorColumn::ROWS_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(where, " has no rows (unknown kind?)"));
}

v1::MetaValue EncodeMeta(const MetaValue& value) {
  struct Encoder {
    v1::MetaValue* out;
    void operator()(bool v) const { out->set_bool_value(v); }
    void operator()(int64_t v) const { out->set_int_value(v); }
    void operator()(double v) const { out->set_double_value(v); }
    void operator()(const std::string& v) const { out->set_string_value(v); }
    void operator()(const Json& v) const { out->set_json_value(v.text); }
  };
  v1::MetaValue out;
  std::visit(Encoder{&out}, value);
  return out;
}

absl::StatusOr<MetaValue> DecodeMeta(const std::string& key, const v1::MetaValue& value) {
  switch (value.kind_case()) {
    case v1::MetaValue::kBoolValue:
      return MetaValue(value.bool_value());
    case v1::MetaValue::kIntValue:
      return MetaValue(value.int_value());
    case v1::MetaValue::kDoubleValue:
      return MetaValue(value.double_value());
    case v1::MetaValue::kStringValue:
      return MetaValue(value.string_value());
    case v1::MetaValue::kJsonValue:
      return MetaValue(Json{value.json_value()});
    case v1::MetaValue::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("meta key '", key, "' has no value"));
}

absl::StatusOr<v1::Tensor> EncodeTensorInto(const at::Tensor& tensor, PayloadBuilder* payload) {
  v1::Tensor message;
  DRAY_ASSIGN_OR_RETURN(v1::DType dtype, WireDType(tensor.scalar_type(), "tensor"));
  message.set_dtype(dtype);
  message.mutable_shape()->Add(tensor.sizes().begin(), tensor.sizes().end());
  const at::Tensor dense = tensor.cpu().contiguous();
  *message.mutable_data() =
      payload->Copy(absl::string_view(static_cast<const char*>(dense.data_ptr()), dense.nbytes()));
  return message;
}

// Encode writes `data`'s columns and meta into `message`, their bytes into `payload`.
absl::Status Encode(const DataProto& data, v1::DataProto* message, PayloadBuilder* payload) {
  for (const auto& [name, tensor] : data.tensors()) {
    v1::TensorColumn* column = message->add_tensors();
    column->set_name(name);
    auto encoded = EncodeTensorInto(tensor, payload);
    if (!encoded.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor column '", name, "': ", encoded.status().message()));
    }
    *column->mutable_tensor() = std::move(encoded).value();
  }
  for (const auto& [name, column] : data.non_tensors()) {
    v1::NonTensorColumn* out = message->add_non_tensors();
    out->set_name(name);
    EncodeNonTensor(column, out, payload);
  }
  for (const auto& [key, value] : data.meta_info()) {
    (*message->mutable_meta_info())[key] = EncodeMeta(value);
  }
  message->set_payload_size(payload->size());
  return absl::OkStatus();
}

// DecodeTensorIn is DecodeTensor on any payload.
absl::StatusOr<at::Tensor> DecodeTensorIn(const v1::Tensor& message, const PayloadView& payload,
                                          absl::string_view where) {
  DRAY_ASSIGN_OR_RETURN(at::ScalarType scalar, ScalarTypeOf(message.dtype(), where));
  const size_t element_size = c10::elementSize(scalar);
  DRAY_ASSIGN_OR_RETURN(uint64_t expected, NumBytes(message.shape(), element_size, where));
  DRAY_ASSIGN_OR_RETURN(Bytes part, payload.Slice(message.data(), where));
  const absl::string_view bytes = part.view();
  if (bytes.size() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": shape [", absl::StrJoin(message.shape(), ", "), "] of ",
                     c10::toString(scalar), " needs ", expected, " bytes, got ", bytes.size()));
  }
  if (scalar == at::kBool) DRAY_RETURN_IF_ERROR(CheckBoolBytes(bytes, where));
  const std::vector<int64_t> shape(message.shape().begin(), message.shape().end());
  const auto options = at::TensorOptions().dtype(scalar);
  if (reinterpret_cast<uintptr_t>(bytes.data()) % element_size != 0) {
    at::Tensor copy = at::empty(shape, options);
    std::memcpy(copy.data_ptr(), bytes.data(), bytes.size());
    return copy;
  }
  auto owner = std::make_shared<Bytes>(std::move(part));
  return at::from_blob(
      const_cast<char*>(bytes.data()), shape, [owner](void*) mutable { owner.reset(); }, options);
}

}  // namespace

absl::StatusOr<v1::Tensor> EncodeTensor(const at::Tensor& tensor, std::string* payload) {
  PayloadBuilder builder(payload, /*reference_large_rows=*/false);
  return EncodeTensorInto(tensor, &builder);
}

absl::StatusOr<at::Tensor> DecodeTensor(const v1::Tensor& message, const Bytes& payload,
                                        absl::string_view where) {
  return DecodeTensorIn(message, PayloadView(payload), where);
}

absl::StatusOr<v1::DataProto> ToWire(const DataProto& data) {
  v1::DataProto message;
  std::string* payload = message.mutable_payload();
  payload->reserve(CopiedBound(data, /*reference_large_rows=*/false));
  PayloadBuilder builder(payload, /*reference_large_rows=*/false);
  DRAY_RETURN_IF_ERROR(Encode(data, &message, &builder));
  return message;
}

absl::StatusOr<DetachedWire> ToDetachedWire(const DataProto& data) {
  auto copied = std::make_shared<std::string>();
  copied->reserve(CopiedBound(data, /*reference_large_rows=*/true));
  PayloadBuilder builder(copied.get(), /*reference_large_rows=*/true);
  DetachedWire wire;
  DRAY_RETURN_IF_ERROR(Encode(data, &wire.header, &builder));
  wire.payload.pieces = builder.Pieces(copied);
  wire.payload.size = builder.size();
  return wire;
}

ScatteredPayload ScatteredPayload::Whole(Bytes bytes) {
  ScatteredPayload payload;
  payload.size = bytes.size();
  payload.pieces.push_back(std::move(bytes));
  return payload;
}

std::string ScatteredPayload::Flatten() const {
  std::string flat;
  flat.reserve(size);
  for (const Bytes& piece : pieces) flat.append(piece.data(), piece.size());
  return flat;
}

absl::StatusOr<DataProto> FromWire(v1::DataProto message) {
  if (message.payload().size() != message.payload_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DataProto payload has ", message.payload().size(), " bytes but payload_size is ",
        message.payload_size(), " (a streamed payload must be attached before decoding)"));
  }
  return FromWire(message, ScatteredPayload::Whole(Bytes(std::move(*message.mutable_payload()))));
}

absl::StatusOr<DataProto> FromWire(const v1::DataProto& message,
                                   const ScatteredPayload& scattered) {
  const PayloadView payload(scattered);
  if (payload.size() != message.payload_size()) {
    return absl::InvalidArgumentError(absl::StrCat("DataProto payload has ", payload.size(),
                                                   " bytes but payload_size is ",
                                                   message.payload_size()));
  }
  DataProto data;
  for (const v1::TensorColumn& column : message.tensors()) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor tensor,
                          DecodeTensorIn(column.tensor(), payload,
                                         absl::StrCat("tensor column '", column.name(), "'")));
    DRAY_RETURN_IF_ERROR(data.AddTensor(column.name(), std::move(tensor)));
  }
  for (const v1::NonTensorColumn& column : message.non_tensors()) {
    DRAY_ASSIGN_OR_RETURN(NonTensorColumn rows, DecodeNonTensor(column, payload));
    DRAY_RETURN_IF_ERROR(data.AddNonTensor(column.name(), std::move(rows)));
  }
  for (const auto& [key, value] : message.meta_info()) {
    DRAY_ASSIGN_OR_RETURN(MetaValue decoded, DecodeMeta(key, value));
    data.SetMeta(key, std::move(decoded));
  }
  return data;
}

}  // namespace dray
