#include "runtime/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/files.h"
#include "base/shape_string.h"
#include "base/status_macros.h"

namespace dray {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A header larger than this is taken for a corrupt length field.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

struct DTypeName {
  const char* name;
  at::ScalarType dtype;
};

constexpr DTypeName kDTypes[] = {
    {"BOOL", at::kBool}, {"U8", at::kByte},    {"I8", at::kChar},  {"I16", at::kShort},
    {"I32", at::kInt},   {"I64", at::kLong},   {"F16", at::kHalf}, {"BF16", at::kBFloat16},
    {"F32", at::kFloat}, {"F64", at::kDouble},
};

absl::StatusOr<at::ScalarType> ParseDType(const std::string& name, absl::string_view where) {
  for (const DTypeName& entry : kDTypes) {
    if (name == entry.name) return entry.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat(where, " has unsupported dtype ", name));
}

absl::StatusOr<std::string> DTypeString(at::ScalarType dtype, absl::string_view name) {
  for (const DTypeName& entry : kDTypes) {
    if (entry.dtype == dtype) return std::string(entry.name);
  }
  return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has dtype ",
                                                 c10::toString(dtype),
                                                 ", which safetensors (here) cannot store"));
}

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  const std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(errno));
  return errno == ENOENT ? absl::NotFoundError(message) : absl::UnavailableError(message);
}

// ReadJson parses a JSON file.
absl::StatusOr<json> ReadJson(const std::string& path) {
  DRAY_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(path, " is not valid JSON"));
  return parsed;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return ErrnoError("cannot stat", path);
  }
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mapping_size_ = static_cast<size_t>(st.st_size);
  if (file->mapping_size_ > 0) {
    // Copy-on-write: tensors may be written to without reaching the file.
    file->mapping_ = mmap(nullptr, file->mapping_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  }
  close(fd);
  if (file->mapping_ == MAP_FAILED) {
    file->mapping_ = nullptr;
    return ErrnoError("cannot map", path);
  }
  const char* bytes = static_cast<const char*>(file->mapping_);
  if (file->mapping_size_ < 8) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": truncated (", file->mapping_size_,
                                                   " bytes, not even a header length)"));
  }
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes, 8);  // little-endian on every host dray runs on
  if (header_size > kMaxHeaderBytes || header_size > file->mapping_size_ - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header length ", header_size, " does not fit in a file of ",
                     file->mapping_size_, " bytes (truncated or not safetensors)"));
  }
  file->data_ = bytes + 8 + header_size;
  file->data_size_ = file->mapping_size_ - 8 - header_size;
  DRAY_RETURN_IF_ERROR(file->ParseHeader(absl::string_view(bytes + 8, header_size)));
  file->self_ = file;
  return std::shared_ptr<const SafetensorsFile>(std::move(file));
}

absl::Status SafetensorsFile::ParseHeader(absl::string_view header) {
  const json parsed =
      json::parse(header.begin(), header.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": the header is not a JSON object"));
  }
  for (const auto& [name, entry] : parsed.items()) {
    const std::string where = absl::StrCat(path_, ": tensor '", name, "'");
    if (name == "__metadata__") {
      if (!entry.is_object())
        return absl::InvalidArgumentError(absl::StrCat(path_, ": __metadata__ is not an object"));
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(path_, ": metadata '", key, "' is not a string"));
        }
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() ||
        !entry.contains("shape") || !entry["shape"].is_array() || !entry.contains("data_offsets") ||
        !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " needs \"dtype\", \"shape\" and two \"data_offsets\""));
    }
    Entry parsed_entry;
    DRAY_ASSIGN_OR_RETURN(parsed_entry.info.dtype,
                          ParseDType(entry["dtype"].get<std::string>(), where));
    uint64_t bytes = c10::elementSize(parsed_entry.info.dtype);
    for (const json& dim : entry["shape"]) {
      if (!dim.is_number_unsigned()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " has a shape entry that is not a non-negative integer"));
      }
      const uint64_t size = dim.get<uint64_t>();
      if (size != 0 && bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / size) {
        return absl::InvalidArgumentError(absl::StrCat(where, " has a shape too large"));
      }
      bytes *= size;
      parsed_entry.info.shape.push_back(static_cast<int64_t>(size));
    }
    for (const json& offset : entry["data_offsets"]) {
      if (!offset.is_number_unsigned()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " has a data offset that is not a non-negative integer"));
      }
    }
    parsed_entry.begin = entry["data_offsets"][0].get<uint64_t>();
    parsed_entry.end = entry["data_offsets"][1].get<uint64_t>();
    if (parsed_entry.begin > parsed_entry.end || parsed_entry.end > data_size_) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has bytes [", parsed_entry.begin, ", ", parsed_entry.end,
                       ") but the data section has ", data_size_, " (truncated?)"));
    }
    if (parsed_entry.end - parsed_entry.begin != bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": shape ", ShapeString(parsed_entry.info.shape), " of ",
                       entry["dtype"].get<std::string>(), " needs ", bytes,
                       " bytes, the header gives ", parsed_entry.end - parsed_entry.begin));
    }
    entries_[name] = std::move(parsed_entry);
  }
  return absl::OkStatus();
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_size_);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> names;
  for (const auto& entry : entries_) names.push_back(entry.first);
  return names;
}

absl::StatusOr<TensorInfo> SafetensorsFile::Info(absl::string_view name) const {
  auto it = entries_.find(std::string(name));
  if (it == entries_.end())
    return absl::NotFoundError(absl::StrCat(path_, " has no tensor '", name, "'"));
  return it->second.info;
}

absl::StatusOr<at::Tensor> SafetensorsFile::Get(absl::string_view name) const {
  auto it = entries_.find(std::string(name));
  if (it == entries_.end())
    return absl::NotFoundError(absl::StrCat(path_, " has no tensor '", name, "'"));
  const Entry& entry = it->second;
  const auto options = at::TensorOptions().dtype(entry.info.dtype);
  const char* bytes = data_ + entry.begin;
  if (reinterpret_cast<uintptr_t>(bytes) % c10::elementSize(entry.info.dtype) != 0) {
    at::Tensor copy = at::empty(entry.info.shape, options);
    std::memcpy(copy.data_ptr(), bytes, entry.end - entry.begin);
    return copy;
  }
  std::shared_ptr<const SafetensorsFile> keep_mapped = self_.lock();
  return at::from_blob(
      const_cast<char*>(bytes), entry.info.shape,
      [keep_mapped](void*) mutable { keep_mapped.reset(); }, options);
}

absl::StatusOr<Checkpoint> Checkpoint::Open(const std::string& path) {
  std::error_code error;
  if (fs::is_directory(path, error)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is a directory; name a .safetensors file or a *.safetensors.index.json"));
  }
  const std::string& target = path;
  Checkpoint checkpoint;
  checkpoint.path_ = target;
  if (!absl::EndsWith(target, ".json")) {
    DRAY_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(target));
    for (const std::string& name : file->names()) checkpoint.file_of_[name] = 0;
    checkpoint.files_.push_back(std::move(file));
    return checkpoint;
  }
  DRAY_ASSIGN_OR_RETURN(json index, ReadJson(target));
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(target, " has no \"weight_map\" object"));
  }
  const fs::path dir = fs::path(target).parent_path();
  std::map<std::string, size_t> file_index;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(target, ": weight_map entry '", name, "' is not a file name"));
    }
    const std::string shard = (dir / file.get<std::string>()).string();
    auto [it, added] = file_index.emplace(shard, checkpoint.files_.size());
    if (added) {
      DRAY_ASSIGN_OR_RETURN(auto opened, SafetensorsFile::Open(shard));
      checkpoint.files_.push_back(std::move(opened));
    }
    if (!checkpoint.files_[it->second]->contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat(target, " places tensor '", name, "' in ",
                                                     shard, ", which does not hold it"));
    }
    checkpoint.file_of_[name] = it->second;
  }
  return checkpoint;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> names;
  for (const auto& entry : file_of_) names.push_back(entry.first);
  return names;
}

bool Checkpoint::contains(absl::string_view name) const {
  return file_of_.count(std::string(name)) != 0;
}

absl::StatusOr<const SafetensorsFile*> Checkpoint::FileOf(absl::string_view name) const {
  auto it = file_of_.find(std::string(name));
  if (it == file_of_.end()) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", path_, " has no tensor '", name, "'"));
  }
  return files_[it->second].get();
}

absl::StatusOr<TensorInfo> Checkpoint::Info(absl::string_view name) const {
  DRAY_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileOf(name));
  return file->Info(name);
}

absl::StatusOr<at::Tensor> Checkpoint::Get(absl::string_view name) const {
  DRAY_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileOf(name));
  return file->Get(name);
}

absl::StatusOr<at::Tensor> Checkpoint::Load(absl::string_view name, at::IntArrayRef shape,
                                            at::ScalarType dtype) const {
  DRAY_ASSIGN_OR_RETURN(at::Tensor tensor, Get(name));
  if (tensor.sizes() != shape) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", path_, ": tensor '", name,
                                                   "' has shape ", ShapeString(tensor.sizes()),
                                                   ", the model expects ", ShapeString(shape)));
  }
  return tensor.to(dtype);
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::map<std::string, at::Tensor> sorted;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__" || !sorted.emplace(name, tensor.cpu().contiguous()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name '", name, "' is reserved or repeated"));
    }
  }
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : sorted) {
    DRAY_ASSIGN_OR_RETURN(std::string dtype, DTypeString(tensor.scalar_type(), name));
    header[name] = {{"dtype", dtype},
                    {"shape", std::vector<int64_t>(tensor.sizes().begin(), tensor.sizes().end())},
                    {"data_offsets", {offset, offset + tensor.nbytes()}}};
    offset += tensor.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    const uint64_t size = text.size();
    out.write(reinterpret_cast<const char*>(&size), 8);
    out.write(text.data(), text.size());
    for (const auto& [name, tensor] : sorted) {
      out.write(static_cast<const char*>(tensor.data_ptr()),
                static_cast<std::streamsize>(tensor.nbytes()));
    }
    if (!out.flush()) return ErrnoError("cannot write", partial);
  }
  // On disk before it takes the name, so readers (and a crash) never see a
  // half-written file.
  if (absl::Status synced = SyncToDisk(partial); !synced.ok()) return synced;
  if (std::rename(partial.c_str(), path.c_str()) != 0) return ErrnoError("cannot rename to", path);
  return absl::OkStatus();
}

absl::Status WriteShardedSafetensors(const std::string& dir, const std::string& prefix,
                                     const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                     uint64_t max_shard_bytes) {
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> shards(1);
  uint64_t shard_bytes = 0;
  for (const auto& named : tensors) {
    const uint64_t bytes = named.second.nbytes();
    if (!shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(named);
    shard_bytes += bytes;
  }
  json weight_map = json::object();
  uint64_t total = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file =
        absl::StrFormat("%s-%05d-of-%05d.safetensors", prefix, i + 1, shards.size());
    DRAY_RETURN_IF_ERROR(
        WriteSafetensors((fs::path(dir) / file).string(), shards[i], {{"format", "pt"}}));
    for (const auto& [name, tensor] : shards[i]) {
      weight_map[name] = file;
      total += tensor.nbytes();
    }
  }
  const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  std::ofstream out(fs::path(dir) / absl::StrCat(prefix, ".safetensors.index.json"));
  out << index.dump(2) << "\n";
  if (!out.flush()) return absl::UnavailableError(absl::StrCat("cannot write the index in ", dir));
  return absl::OkStatus();
}

}  // namespace dray
