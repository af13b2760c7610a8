// DataProto: the batch that travels between the controller and its workers.
//
// A DataProto holds named columns that share one batch dimension (rows):
//  - tensor columns: at::Tensor whose first dimension is the batch;
//  - non-tensor columns: one value per row, all of one kind (strings, bytes,
//    images, ints, doubles or JSON);
// and meta info: named values for the whole batch (not per row).
//
// It is the C++ counterpart of verl's DataProto, with one difference kept
// throughout: no operation changes its input unless its name says so
// (PopColumns). Row operations return new DataProtos; results of Slice, Chunk
// and Split may share tensor storage with the input, as torch slicing does.
//
//   DRAY_ASSIGN_OR_RETURN(DataProto batch, DataProto::Make(
//       {{"latents", at::zeros({10, 4})}},
//       {{"instructions", std::vector<std::string>(10, "make it blue")}},
//       {{"steps", int64_t{20}}}));
//   DRAY_ASSIGN_OR_RETURN(PaddedDataProto padded, batch.PadToDivisor(4));
//   DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> shards, padded.data.Chunk(4));
//   ...
//   DRAY_ASSIGN_OR_RETURN(DataProto joined, DataProto::Concat(results));
//   DRAY_ASSIGN_OR_RETURN(DataProto result, joined.Unpad(padded.pad_size));
//
// Errors are absl::Status: INVALID_ARGUMENT for bad input (naming the column
// and the sizes involved), NOT_FOUND for an unknown column or meta key.
//
// Thread-safety: a DataProto is a value; const methods may run concurrently.
#ifndef DRAY_DISPATCH_DATA_PROTO_H_
#define DRAY_DISPATCH_DATA_PROTO_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace dray {

// Bytes: an immutable byte buffer that copies share, so that selecting,
// chunking and concatenating rows of images or blobs never copies their
// bytes, and decoded rows alias the received payload (as tensors do).
//
//   Bytes png = ReadFile("in.png");     // from std::string: takes it over
//   absl::string_view data = png.view();
class Bytes {
 public:
  Bytes() = default;
  Bytes(std::string data)  // NOLINT: implicit, a string is the natural source
      : owner_(std::make_shared<const std::string>(std::move(data))),
        view_(*static_cast<const std::string*>(owner_.get())) {}
  Bytes(const char* data) : Bytes(std::string(data)) {}  // NOLINT

  // Alias views `bytes`, kept valid by `owner`.
  static Bytes Alias(std::shared_ptr<const void> owner, absl::string_view bytes) {
    Bytes out;
    out.owner_ = std::move(owner);
    out.view_ = bytes;
    return out;
  }

  // Part views `part`, which must lie within this view, kept valid by the
  // same owner.
  Bytes Part(absl::string_view part) const { return Alias(owner_, part); }

  absl::string_view view() const { return view_; }
  const char* data() const { return view_.data(); }
  size_t size() const { return view_.size(); }
  bool empty() const { return view_.empty(); }

  friend bool operator==(const Bytes& a, const Bytes& b) { return a.view_ == b.view_; }

 private:
  std::shared_ptr<const void> owner_;
  absl::string_view view_;
};

// Image: one image row, encoded (PNG, JPEG) or raw interleaved HWC uint8.
struct Image {
  enum class Format { kPng, kJpeg, kRaw };
  Format format = Format::kPng;
  // Required for kRaw (bytes.size() == width * height * channels); for encoded
  // images informative only, 0 when unknown.
  int32_t width = 0;
  int32_t height = 0;
  int32_t channels = 0;
  Bytes bytes;

  friend bool operator==(const Image& a, const Image& b) {
    return a.format == b.format && a.width == b.width && a.height == b.height &&
           a.channels == b.channels && a.bytes == b.bytes;
  }
};

// Json: one JSON document, kept as text.
struct Json {
  std::string text;
  friend bool operator==(const Json& a, const Json& b) { return a.text == b.text; }
};

// NonTensorColumn: the rows of one non-tensor column.
using NonTensorColumn =
    std::variant<std::vector<std::string>, std::vector<Bytes>, std::vector<Image>,
                 std::vector<int64_t>, std::vector<double>, std::vector<Json>>;

// MetaValue: one meta-info entry.
using MetaValue = std::variant<bool, int64_t, double, std::string, Json>;

// MetaValueKind names the kind of `value` ("bool", "int", ...).
absl::string_view MetaValueKind(const MetaValue& value);

// MetaInfo: meta info by key.
using MetaInfo = std::map<std::string, MetaValue>;

using TensorColumns = std::vector<std::pair<std::string, at::Tensor>>;
using NonTensorColumns = std::vector<std::pair<std::string, NonTensorColumn>>;

// NonTensorColumnRows returns the number of rows of `column`.
int64_t NonTensorColumnRows(const NonTensorColumn& column);

// NonTensorColumnKind names the kind of `column` ("strings", "images", ...).
absl::string_view NonTensorColumnKind(const NonTensorColumn& column);

// ColumnSelection: which columns and meta keys an operation takes; a field
// left unset means "all of them".
struct ColumnSelection {
  std::optional<std::vector<std::string>> tensors;
  std::optional<std::vector<std::string>> non_tensors;
  std::optional<std::vector<std::string>> meta;
};

// PaddedDataProto: the result of PadToDivisor; `pad_size` rows were appended.
struct PaddedDataProto;

class DataProto {
 public:
  // An empty batch: no columns, no meta info, size() == 0.
  DataProto() = default;

  // Make builds a DataProto; every column must have the same number of rows,
  // every tensor at least one dimension, and every name must be unique.
  static absl::StatusOr<DataProto> Make(TensorColumns tensors, NonTensorColumns non_tensors = {},
                                        MetaInfo meta_info = {});

  // Concat joins batches row-wise. All pieces must have the same columns (same
  // names, kinds, dtypes and trailing shapes); meta info is merged, and a key
  // with different values in two pieces is an error naming it.
  static absl::StatusOr<DataProto> Concat(absl::Span<const DataProto> pieces);

  // size returns the number of rows (0 when there are no columns).
  int64_t size() const { return size_; }

  const TensorColumns& tensors() const { return tensors_; }
  const NonTensorColumns& non_tensors() const { return non_tensors_; }
  const MetaInfo& meta_info() const { return meta_info_; }

  // HasColumn is true when a tensor or non-tensor column is named `name`.
  bool HasColumn(absl::string_view name) const;

  // GetTensor returns the tensor column `name` (NOT_FOUND if absent).
  absl::StatusOr<at::Tensor> GetTensor(absl::string_view name) const;

  // GetRows returns the rows of non-tensor column `name`, which must hold T
  // (std::string, Bytes, Image, int64_t, double or Json).
  template <typename T>
  absl::StatusOr<const std::vector<T>*> GetRows(absl::string_view name) const;

  // GetMeta returns meta-info entry `key`, which must hold T.
  template <typename T>
  absl::StatusOr<T> GetMeta(absl::string_view key) const;

  // AddTensor, AddNonTensor and SetMeta change this DataProto in place. A
  // column must match size() unless it is the first column.
  absl::Status AddTensor(std::string name, at::Tensor tensor);
  absl::Status AddNonTensor(std::string name, NonTensorColumn column);
  void SetMeta(std::string key, MetaValue value);

  // Select keeps the chosen columns and meta keys (all rows).
  absl::StatusOr<DataProto> Select(const ColumnSelection& selection) const;

  // PopColumns removes the chosen columns and meta keys from this DataProto
  // and returns them; unset fields of `selection` pop nothing.
  absl::StatusOr<DataProto> PopColumns(const ColumnSelection& selection);

  // Rename returns a copy where column `from` is called `to`.
  absl::StatusOr<DataProto> Rename(absl::string_view from, absl::string_view to) const;

  // Union returns the columns and meta info of both. A name present in both
  // must hold identical values; otherwise it is an error naming it.
  absl::StatusOr<DataProto> Union(const DataProto& other) const;

  // SelectRows returns rows `indices` in that order (repeats allowed);
  // negative indices count from the end, as in Python.
  absl::StatusOr<DataProto> SelectRows(absl::Span<const int64_t> indices) const;

  // SelectMask returns the rows whose mask entry is true.
  absl::StatusOr<DataProto> SelectMask(const std::vector<bool>& mask) const;

  // Slice returns rows [start:end:step] with Python's rules (negative
  // positions count from the end, out-of-range positions are clamped); step > 0.
  absl::StatusOr<DataProto> Slice(int64_t start, int64_t end, int64_t step = 1) const;

  // Chunk splits into `n` equal pieces; size() must divide by n (PadToDivisor
  // first for an uneven batch).
  absl::StatusOr<std::vector<DataProto>> Chunk(int64_t n) const;

  // Split cuts into pieces of `rows` rows; the last piece may be shorter.
  absl::StatusOr<std::vector<DataProto>> Split(int64_t rows) const;

  // Repeat repeats every row `times` times: interleaved (a a b b) or tiled
  // (a b a b).
  absl::StatusOr<DataProto> Repeat(int64_t times, bool interleave = true) const;

  // Reorder returns the rows in the order of `permutation`, which must hold
  // each of 0..size()-1 exactly once.
  absl::StatusOr<DataProto> Reorder(absl::Span<const int64_t> permutation) const;

  // PadToDivisor appends copies of the first rows (cycling) until size()
  // divides by `divisor`.
  absl::StatusOr<PaddedDataProto> PadToDivisor(int64_t divisor) const;

  // Unpad drops the last `pad_size` rows.
  absl::StatusOr<DataProto> Unpad(int64_t pad_size) const;

 private:
  // TakeRows gathers rows by (already validated, non-negative) index.
  DataProto TakeRows(const std::vector<int64_t>& indices) const;
  // RowRange returns rows [start, end) with the given step, as tensor views.
  DataProto RowRange(int64_t start, int64_t end, int64_t step) const;

  int64_t size_ = 0;
  TensorColumns tensors_;
  NonTensorColumns non_tensors_;
  MetaInfo meta_info_;
};

struct PaddedDataProto {
  DataProto data;
  int64_t pad_size = 0;
};

// ContentBytes: the bytes of `data`'s rows (tensor elements, strings,
// bytes, image data, numbers): about what it costs to send, without the
// names and shapes that describe them.
int64_t ContentBytes(const DataProto& data);

// SameTensor is true when `a` and `b` have the same dtype, shape and bytes
// (so NaNs compare equal and -0.0 differs from 0.0).
bool SameTensor(const at::Tensor& a, const at::Tensor& b);

// SameDataProto is true when both hold the same columns in the same order,
// with identical values, and the same meta info.
bool SameDataProto(const DataProto& a, const DataProto& b);

// operator<< describes a batch for messages and test failures, without its
// values: "DataProto(4 rows; x [4, 2] Float, prompts; meta step)".
std::ostream& operator<<(std::ostream& out, const DataProto& data);

// --- Implementation details of the templates above. ---

namespace internal {
absl::Status NotFound(absl::string_view what, absl::string_view name);
absl::Status WrongKind(absl::string_view what, absl::string_view name, absl::string_view actual,
                       absl::string_view expected);
}  // namespace internal

template <typename T>
absl::StatusOr<const std::vector<T>*> DataProto::GetRows(absl::string_view name) const {
  for (const auto& [column_name, column] : non_tensors_) {
    if (column_name != name) continue;
    const auto* rows = std::get_if<std::vector<T>>(&column);
    if (rows == nullptr) {
      return internal::WrongKind("non-tensor column", name, NonTensorColumnKind(column),
                                 NonTensorColumnKind(NonTensorColumn(std::vector<T>())));
    }
    return rows;
  }
  return internal::NotFound("non-tensor column", name);
}

template <typename T>
absl::StatusOr<T> DataProto::GetMeta(absl::string_view key) const {
  auto it = meta_info_.find(std::string(key));
  if (it == meta_info_.end()) return internal::NotFound("meta key", key);
  const T* value = std::get_if<T>(&it->second);
  if (value == nullptr) {
    return internal::WrongKind("meta key", key, MetaValueKind(it->second),
                               MetaValueKind(MetaValue(T{})));
  }
  return *value;
}

}  // namespace dray

#endif  // DRAY_DISPATCH_DATA_PROTO_H_
