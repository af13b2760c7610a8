#include "dispatch/data_proto.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/index_select.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/shape_string.h"
#include "base/status_macros.h"

namespace dray {
namespace {

constexpr absl::string_view kNonTensorKinds[] = {"strings", "bytes",   "images",
                                                 "ints",    "doubles", "json"};
constexpr absl::string_view kMetaKinds[] = {"bool", "int", "double", "string", "json"};

NonTensorColumn TakeRowsOf(const NonTensorColumn& column, const std::vector<int64_t>& indices) {
  return std::visit(
      [&](const auto& rows) -> NonTensorColumn {
        std::decay_t<decltype(rows)> out;
        out.reserve(indices.size());
        for (int64_t i : indices) out.push_back(rows[i]);
        return out;
      },
      column);
}

// AppendRows appends the rows of `from` to `into`; both must hold the same kind.
void AppendRows(const NonTensorColumn& from, NonTensorColumn* into) {
  std::visit(
      [&](auto& rows) {
        const auto& more = std::get<std::decay_t<decltype(rows)>>(from);
        rows.insert(rows.end(), more.begin(), more.end());
      },
      *into);
}

std::vector<int64_t> Range(int64_t start, int64_t end, int64_t step) {
  std::vector<int64_t> indices;
  for (int64_t i = start; i < end; i += step) indices.push_back(i);
  return indices;
}

// MergeMeta adds `from` into `into`; a key already there with another value
// is an error naming the key and `where` it came from.
absl::Status MergeMeta(const MetaInfo& from, absl::string_view where, MetaInfo* into) {
  for (const auto& [key, value] : from) {
    auto [it, inserted] = into->emplace(key, value);
    if (!inserted && !(it->second == value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("meta key '", key, "' has conflicting values (", where, ")"));
    }
  }
  return absl::OkStatus();
}

template <typename Column>
const Column* FindColumn(const std::vector<std::pair<std::string, Column>>& columns,
                         absl::string_view name) {
  for (const auto& [column_name, column] : columns) {
    if (column_name == name) return &column;
  }
  return nullptr;
}

template <typename Column>
void EraseColumns(const std::vector<std::string>& names,
                  std::vector<std::pair<std::string, Column>>* columns) {
  columns->erase(std::remove_if(columns->begin(), columns->end(),
                                [&names](const auto& column) {
                                  return std::find(names.begin(), names.end(), column.first) !=
                                         names.end();
                                }),
                 columns->end());
}

// CheckLayoutMatches verifies that `piece` has the columns of `first`, with
// the same kinds, dtypes and trailing shapes, so that the two can be concatenated.
absl::Status CheckLayoutMatches(const DataProto& first, const DataProto& piece, size_t index) {
  const std::string where = absl::StrCat("piece ", index, " of the concat");
  if (piece.tensors().size() != first.tensors().size() ||
      piece.non_tensors().size() != first.non_tensors().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has ", piece.tensors().size(), " tensor and ",
                     piece.non_tensors().size(), " non-tensor columns; piece 0 has ",
                     first.tensors().size(), " and ", first.non_tensors().size()));
  }
  for (const auto& [name, tensor] : first.tensors()) {
    const at::Tensor* other = FindColumn(piece.tensors(), name);
    if (other == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has no tensor column '", name, "'"));
    }
    if (other->scalar_type() != tensor.scalar_type() ||
        other->sizes().slice(1) != tensor.sizes().slice(1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": tensor column '", name, "' is ", c10::toString(other->scalar_type()), " ",
          ShapeString(other->sizes()), ", piece 0 has ", c10::toString(tensor.scalar_type()), " ",
          ShapeString(tensor.sizes())));
    }
  }
  for (const auto& [name, column] : first.non_tensors()) {
    const NonTensorColumn* other = FindColumn(piece.non_tensors(), name);
    if (other == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has no non-tensor column '", name, "'"));
    }
    if (other->index() != column.index()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": non-tensor column '", name, "' holds ", NonTensorColumnKind(*other),
          ", piece 0 holds ", NonTensorColumnKind(column)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {

absl::Status NotFound(absl::string_view what, absl::string_view name) {
  return absl::NotFoundError(absl::StrCat("no ", what, " '", name, "'"));
}

absl::Status WrongKind(absl::string_view what, absl::string_view name, absl::string_view actual,
                       absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, " '", name, "' holds ", actual, ", not ", expected));
}

}  // namespace internal

int64_t NonTensorColumnRows(const NonTensorColumn& column) {
  return std::visit([](const auto& rows) { return static_cast<int64_t>(rows.size()); }, column);
}

namespace {

int64_t RowBytes(const std::string& row) { return static_cast<int64_t>(row.size()); }
int64_t RowBytes(const Bytes& row) { return static_cast<int64_t>(row.view().size()); }
int64_t RowBytes(const Image& row) { return static_cast<int64_t>(row.bytes.view().size()); }
int64_t RowBytes(int64_t) { return sizeof(int64_t); }
int64_t RowBytes(double) { return sizeof(double); }
int64_t RowBytes(const Json& row) { return static_cast<int64_t>(row.text.size()); }

}  // namespace

int64_t ContentBytes(const DataProto& data) {
  int64_t bytes = 0;
  for (const auto& [name, tensor] : data.tensors()) bytes += tensor.nbytes();
  for (const auto& [name, column] : data.non_tensors()) {
    std::visit(
        [&bytes](const auto& rows) {
          for (const auto& row : rows) bytes += RowBytes(row);
        },
        column);
  }
  return bytes;
}

absl::string_view NonTensorColumnKind(const NonTensorColumn& column) {
  return kNonTensorKinds[column.index()];
}

absl::string_view MetaValueKind(const MetaValue& value) { return kMetaKinds[value.index()]; }

bool SameTensor(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor x = a.cpu().contiguous();
  const at::Tensor y = b.cpu().contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

bool SameDataProto(const DataProto& a, const DataProto& b) {
  if (a.size() != b.size() || a.tensors().size() != b.tensors().size() ||
      a.non_tensors() != b.non_tensors() || a.meta_info() != b.meta_info()) {
    return false;
  }
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    if (a.tensors()[i].first != b.tensors()[i].first ||
        !SameTensor(a.tensors()[i].second, b.tensors()[i].second)) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<DataProto> DataProto::Make(TensorColumns tensors, NonTensorColumns non_tensors,
                                          MetaInfo meta_info) {
  DataProto data;
  for (auto& [name, tensor] : tensors) {
    DRAY_RETURN_IF_ERROR(data.AddTensor(std::move(name), std::move(tensor)));
  }
  for (auto& [name, column] : non_tensors) {
    DRAY_RETURN_IF_ERROR(data.AddNonTensor(std::move(name), std::move(column)));
  }
  data.meta_info_ = std::move(meta_info);
  return data;
}

bool DataProto::HasColumn(absl::string_view name) const {
  return FindColumn(tensors_, name) != nullptr || FindColumn(non_tensors_, name) != nullptr;
}

absl::StatusOr<at::Tensor> DataProto::GetTensor(absl::string_view name) const {
  const at::Tensor* tensor = FindColumn(tensors_, name);
  if (tensor == nullptr) return internal::NotFound("tensor column", name);
  return *tensor;
}

absl::Status DataProto::AddTensor(std::string name, at::Tensor tensor) {
  if (!tensor.defined()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor column '", name, "' is undefined"));
  }
  if (tensor.dim() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor column '", name, "' is 0-d; a column needs a batch dimension"));
  }
  if (tensor.layout() != at::kStrided) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor column '", name, "' is not a dense (strided) tensor"));
  }
  if (HasColumn(name))
    return absl::InvalidArgumentError(absl::StrCat("duplicate column '", name, "'"));
  const bool first = tensors_.empty() && non_tensors_.empty();
  if (!first && tensor.size(0) != size_) {
    return absl::InvalidArgumentError(absl::StrCat("inconsistent batch sizes: tensor column '",
                                                   name, "' has ", tensor.size(0),
                                                   " rows, the batch has ", size_));
  }
  size_ = tensor.size(0);
  tensors_.emplace_back(std::move(name), std::move(tensor));
  return absl::OkStatus();
}

absl::Status DataProto::AddNonTensor(std::string name, NonTensorColumn column) {
  if (HasColumn(name))
    return absl::InvalidArgumentError(absl::StrCat("duplicate column '", name, "'"));
  const int64_t rows = NonTensorColumnRows(column);
  const bool first = tensors_.empty() && non_tensors_.empty();
  if (!first && rows != size_) {
    return absl::InvalidArgumentError(absl::StrCat("inconsistent batch sizes: non-tensor column '",
                                                   name, "' has ", rows, " rows, the batch has ",
                                                   size_));
  }
  size_ = rows;
  non_tensors_.emplace_back(std::move(name), std::move(column));
  return absl::OkStatus();
}

void DataProto::SetMeta(std::string key, MetaValue value) {
  meta_info_[std::move(key)] = std::move(value);
}

absl::StatusOr<DataProto> DataProto::Select(const ColumnSelection& selection) const {
  DataProto out;
  out.size_ = size_;
  if (selection.tensors.has_value()) {
    for (const std::string& name : *selection.tensors) {
      DRAY_ASSIGN_OR_RETURN(at::Tensor tensor, GetTensor(name));
      DRAY_RETURN_IF_ERROR(out.AddTensor(name, std::move(tensor)));
    }
  } else {
    out.tensors_ = tensors_;
  }
  if (selection.non_tensors.has_value()) {
    for (const std::string& name : *selection.non_tensors) {
      const NonTensorColumn* column = FindColumn(non_tensors_, name);
      if (column == nullptr) return internal::NotFound("non-tensor column", name);
      DRAY_RETURN_IF_ERROR(out.AddNonTensor(name, *column));
    }
  } else {
    out.non_tensors_ = non_tensors_;
  }
  if (selection.meta.has_value()) {
    for (const std::string& key : *selection.meta) {
      auto it = meta_info_.find(key);
      if (it == meta_info_.end()) return internal::NotFound("meta key", key);
      out.meta_info_.insert(*it);
    }
  } else {
    out.meta_info_ = meta_info_;
  }
  if (out.tensors_.empty() && out.non_tensors_.empty()) out.size_ = 0;
  return out;
}

absl::StatusOr<DataProto> DataProto::PopColumns(const ColumnSelection& selection) {
  ColumnSelection popped_only{selection.tensors.value_or(std::vector<std::string>{}),
                              selection.non_tensors.value_or(std::vector<std::string>{}),
                              selection.meta.value_or(std::vector<std::string>{})};
  DRAY_ASSIGN_OR_RETURN(DataProto popped, Select(popped_only));
  EraseColumns(*popped_only.tensors, &tensors_);
  EraseColumns(*popped_only.non_tensors, &non_tensors_);
  for (const std::string& key : *popped_only.meta) meta_info_.erase(key);
  if (tensors_.empty() && non_tensors_.empty()) size_ = 0;
  return popped;
}

absl::StatusOr<DataProto> DataProto::Rename(absl::string_view from, absl::string_view to) const {
  if (from == to) return *this;
  if (HasColumn(to)) return absl::InvalidArgumentError(absl::StrCat("duplicate column '", to, "'"));
  DataProto out = *this;
  for (auto& column : out.tensors_) {
    if (column.first == from) {
      column.first = std::string(to);
      return out;
    }
  }
  for (auto& column : out.non_tensors_) {
    if (column.first == from) {
      column.first = std::string(to);
      return out;
    }
  }
  return internal::NotFound("column", from);
}

absl::StatusOr<DataProto> DataProto::Union(const DataProto& other) const {
  DataProto out = *this;
  for (const auto& [name, tensor] : other.tensors_) {
    const at::Tensor* mine = FindColumn(tensors_, name);
    if (mine == nullptr) {
      DRAY_RETURN_IF_ERROR(out.AddTensor(name, tensor));
    } else if (!SameTensor(*mine, tensor)) {
      return absl::InvalidArgumentError(
          absl::StrCat("union: tensor column '", name, "' differs between the two batches"));
    }
  }
  for (const auto& [name, column] : other.non_tensors_) {
    const NonTensorColumn* mine = FindColumn(non_tensors_, name);
    if (mine == nullptr) {
      DRAY_RETURN_IF_ERROR(out.AddNonTensor(name, column));
    } else if (!(*mine == column)) {
      return absl::InvalidArgumentError(
          absl::StrCat("union: non-tensor column '", name, "' differs between the two batches"));
    }
  }
  DRAY_RETURN_IF_ERROR(MergeMeta(other.meta_info_, "union", &out.meta_info_));
  return out;
}

DataProto DataProto::TakeRows(const std::vector<int64_t>& indices) const {
  DataProto out;
  out.meta_info_ = meta_info_;
  out.size_ = static_cast<int64_t>(indices.size());
  const at::Tensor index =
      at::from_blob(const_cast<int64_t*>(indices.data()), {out.size_}, at::kLong);
  for (const auto& [name, tensor] : tensors_) {
    out.tensors_.emplace_back(name, at::index_select(tensor, 0, index.to(tensor.device())));
  }
  for (const auto& [name, column] : non_tensors_) {
    out.non_tensors_.emplace_back(name, TakeRowsOf(column, indices));
  }
  if (out.tensors_.empty() && out.non_tensors_.empty()) out.size_ = 0;
  return out;
}

DataProto DataProto::RowRange(int64_t start, int64_t end, int64_t step) const {
  DataProto out;
  out.meta_info_ = meta_info_;
  const std::vector<int64_t> indices = Range(start, end, step);
  out.size_ = static_cast<int64_t>(indices.size());
  for (const auto& [name, tensor] : tensors_) {
    out.tensors_.emplace_back(name, tensor.slice(0, start, std::max(start, end), step));
  }
  for (const auto& [name, column] : non_tensors_) {
    out.non_tensors_.emplace_back(name, TakeRowsOf(column, indices));
  }
  if (out.tensors_.empty() && out.non_tensors_.empty()) out.size_ = 0;
  return out;
}

absl::StatusOr<DataProto> DataProto::SelectRows(absl::Span<const int64_t> indices) const {
  std::vector<int64_t> normalized;
  normalized.reserve(indices.size());
  for (int64_t i : indices) {
    const int64_t row = i < 0 ? i + size_ : i;
    if (row < 0 || row >= size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("row index ", i, " is out of range for a batch of ", size_, " rows"));
    }
    normalized.push_back(row);
  }
  return TakeRows(normalized);
}

absl::StatusOr<DataProto> DataProto::SelectMask(const std::vector<bool>& mask) const {
  if (static_cast<int64_t>(mask.size()) != size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("row mask has ", mask.size(), " entries for a batch of ", size_, " rows"));
  }
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < size_; ++i) {
    if (mask[i]) indices.push_back(i);
  }
  return TakeRows(indices);
}

absl::StatusOr<DataProto> DataProto::Slice(int64_t start, int64_t end, int64_t step) const {
  if (step <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("slice step must be positive, got ", step));
  }
  auto clamp = [this](int64_t position) {
    if (position < 0) position += size_;
    return std::clamp<int64_t>(position, 0, size_);
  };
  return RowRange(clamp(start), clamp(end), step);
}

absl::StatusOr<std::vector<DataProto>> DataProto::Chunk(int64_t n) const {
  if (n <= 0)
    return absl::InvalidArgumentError(absl::StrCat("chunk count must be positive, got ", n));
  if (size_ % n != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a batch of ", size_, " rows does not divide into ", n,
                     " chunks; pad it first with PadToDivisor(", n, ")"));
  }
  const int64_t rows = size_ / n;
  std::vector<DataProto> chunks;
  chunks.reserve(n);
  for (int64_t i = 0; i < n; ++i) chunks.push_back(RowRange(i * rows, (i + 1) * rows, 1));
  return chunks;
}

absl::StatusOr<std::vector<DataProto>> DataProto::Split(int64_t rows) const {
  if (rows <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("split size must be positive, got ", rows));
  }
  if (size_ == 0) return std::vector<DataProto>{*this};
  std::vector<DataProto> pieces;
  for (int64_t start = 0; start < size_; start += rows) {
    pieces.push_back(RowRange(start, std::min(start + rows, size_), 1));
  }
  return pieces;
}

absl::StatusOr<DataProto> DataProto::Concat(absl::Span<const DataProto> pieces) {
  if (pieces.empty()) return DataProto();
  const DataProto& first = pieces[0];
  DataProto out;
  out.size_ = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    DRAY_RETURN_IF_ERROR(CheckLayoutMatches(first, pieces[i], i));
    DRAY_RETURN_IF_ERROR(MergeMeta(pieces[i].meta_info_,
                                   absl::StrCat("piece ", i, " of the concat"), &out.meta_info_));
    out.size_ += pieces[i].size_;
  }
  for (const auto& [name, tensor] : first.tensors_) {
    std::vector<at::Tensor> parts;
    parts.reserve(pieces.size());
    for (const DataProto& piece : pieces) parts.push_back(*FindColumn(piece.tensors_, name));
    out.tensors_.emplace_back(name, at::cat(parts, 0));
  }
  for (const auto& [name, column] : first.non_tensors_) {
    NonTensorColumn joined = column;
    for (size_t i = 1; i < pieces.size(); ++i) {
      AppendRows(*FindColumn(pieces[i].non_tensors_, name), &joined);
    }
    out.non_tensors_.emplace_back(name, std::move(joined));
  }
  return out;
}

absl::StatusOr<DataProto> DataProto::Repeat(int64_t times, bool interleave) const {
  if (times <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("repeat count must be positive, got ", times));
  }
  std::vector<int64_t> indices;
  indices.reserve(size_ * times);
  for (int64_t outer = 0; outer < (interleave ? size_ : times); ++outer) {
    for (int64_t inner = 0; inner < (interleave ? times : size_); ++inner) {
      indices.push_back(interleave ? outer : inner);
    }
  }
  return TakeRows(indices);
}

absl::StatusOr<DataProto> DataProto::Reorder(absl::Span<const int64_t> permutation) const {
  if (static_cast<int64_t>(permutation.size()) != size_) {
    return absl::InvalidArgumentError(absl::StrCat("reorder: permutation has ", permutation.size(),
                                                   " entries for a batch of ", size_, " rows"));
  }
  std::vector<bool> seen(size_, false);
  for (int64_t i : permutation) {
    if (i < 0 || i >= size_ || seen[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("reorder: not a permutation of 0..", size_ - 1, " (entry ", i, ")"));
    }
    seen[i] = true;
  }
  return TakeRows(std::vector<int64_t>(permutation.begin(), permutation.end()));
}

absl::StatusOr<PaddedDataProto> DataProto::PadToDivisor(int64_t divisor) const {
  if (divisor <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("pad divisor must be positive, got ", divisor));
  }
  const int64_t pad_size = (divisor - size_ % divisor) % divisor;
  if (pad_size == 0) return PaddedDataProto{*this, 0};
  std::vector<int64_t> indices = Range(0, size_, 1);
  for (int64_t i = 0; i < pad_size; ++i) indices.push_back(i % size_);
  return PaddedDataProto{TakeRows(indices), pad_size};
}

absl::StatusOr<DataProto> DataProto::Unpad(int64_t pad_size) const {
  if (pad_size < 0 || pad_size > size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot remove ", pad_size, " padding rows from a batch of ", size_));
  }
  return RowRange(0, size_ - pad_size, 1);
}

std::ostream& operator<<(std::ostream& out, const DataProto& data) {
  std::vector<std::string> columns;
  for (const auto& [name, tensor] : data.tensors())
    columns.push_back(absl::StrCat(name, " ", ShapeString(tensor.sizes()), " ",
                                   c10::toString(tensor.scalar_type())));
  for (const auto& column : data.non_tensors()) columns.push_back(column.first);
  std::vector<std::string> meta;
  for (const auto& entry : data.meta_info()) meta.push_back(entry.first);
  out << "DataProto(" << data.size() << " rows; " << absl::StrJoin(columns, ", ");
  if (!meta.empty()) out << "; meta " << absl::StrJoin(meta, ", ");
  return out << ")";
}

}  // namespace dray
