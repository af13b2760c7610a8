// Reading and writing safetensors, the checkpoint format of Hugging Face and
// diffusers: an 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the raw little-endian data.
//
//   DRAY_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open("transformer/model.safetensors"));
//   DRAY_ASSIGN_OR_RETURN(at::Tensor w, ckpt.Load("proj_out.weight", {64, 128}, at::kFloat));
//
//   DRAY_RETURN_IF_ERROR(WriteSafetensors("out.safetensors", {{"w", w}}, {{"format", "pt"}}));
//
// Files are memory-mapped copy-on-write: tensors from Get alias the mapping
// (nothing is read until touched; writing to them never reaches the file).
// Every header field is validated; a bad file is INVALID_ARGUMENT naming the
// file and what is wrong, a missing tensor NOT_FOUND naming it.
//
// Thread-safety: SafetensorsFile and Checkpoint are immutable after Open and
// safe to share.
#ifndef DRAY_RUNTIME_IO_SAFETENSORS_H_
#define DRAY_RUNTIME_IO_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dray {

// TensorInfo: what a header says about one tensor.
struct TensorInfo {
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};

// SafetensorsFile: one memory-mapped .safetensors file.
class SafetensorsFile {
 public:
  static absl::StatusOr<std::shared_ptr<const SafetensorsFile>> Open(const std::string& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // names lists the tensors, sorted.
  std::vector<std::string> names() const;
  bool contains(absl::string_view name) const { return entries_.count(std::string(name)) != 0; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  absl::StatusOr<TensorInfo> Info(absl::string_view name) const;

  // Get returns tensor `name` as stored. It aliases the mapping (and keeps
  // the file mapped) unless its bytes are misaligned for its dtype, in which
  // case it is a copy.
  absl::StatusOr<at::Tensor> Get(absl::string_view name) const;

 private:
  struct Entry {
    TensorInfo info;
    uint64_t begin = 0;  // within the data section
    uint64_t end = 0;
  };

  SafetensorsFile() = default;
  absl::Status ParseHeader(absl::string_view header);

  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  const char* data_ = nullptr;  // start of the data section
  uint64_t data_size_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
  std::weak_ptr<const SafetensorsFile> self_;  // keeps the mapping alive from tensors
};

// Checkpoint: a model's tensors in one safetensors file or sharded over
// several, listed by a `*.safetensors.index.json` (its "weight_map").
class Checkpoint {
 public:
  // Open accepts a .safetensors file or an index .json. (Which file of a
  // model directory holds the weights is the model's convention, not this
  // format's: see workers/models/component_weights.h.)
  static absl::StatusOr<Checkpoint> Open(const std::string& path);

  // names lists every tensor, sorted.
  std::vector<std::string> names() const;
  bool contains(absl::string_view name) const;

  absl::StatusOr<TensorInfo> Info(absl::string_view name) const;

  // Get returns tensor `name` as stored (see SafetensorsFile::Get).
  absl::StatusOr<at::Tensor> Get(absl::string_view name) const;

  // Load returns tensor `name` converted to `dtype` (bfloat16 and float16
  // widen exactly), after checking that its shape is `shape`: a different
  // shape is INVALID_ARGUMENT naming the tensor and both shapes.
  absl::StatusOr<at::Tensor> Load(absl::string_view name, at::IntArrayRef shape,
                                  at::ScalarType dtype) const;

 private:
  absl::StatusOr<const SafetensorsFile*> FileOf(absl::string_view name) const;

  std::string path_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, size_t> file_of_;  // tensor name -> index in files_
};

// WriteSafetensors writes `tensors` to `path` (sorted by name, as the
// reference implementation does), with optional string metadata. Every
// dtype dray.v1 carries is supported; names must be unique.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// WriteShardedSafetensors writes `tensors` into `dir` as
// `<prefix>-0000K-of-0000N.safetensors` files of at most `max_shard_bytes`
// each (a larger tensor gets a file of its own) plus
// `<prefix>.safetensors.index.json`, the layout diffusers and transformers use.
absl::Status WriteShardedSafetensors(const std::string& dir, const std::string& prefix,
                                     const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                     uint64_t max_shard_bytes);

}  // namespace dray

#endif  // DRAY_RUNTIME_IO_SAFETENSORS_H_
