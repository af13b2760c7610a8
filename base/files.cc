#include "base/files.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"

namespace dray {
namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path, int error) {
  const std::string message = absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(error));
  switch (error) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::UnavailableError(message);
  }
}

struct CloseFile {
  void operator()(std::FILE* file) const { std::fclose(file); }
};

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::unique_ptr<std::FILE, CloseFile> file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) return ErrnoError("read", path, errno);
  std::string bytes;
  char buffer[1 << 16];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), file.get())) > 0) bytes.append(buffer, got);
  if (std::ferror(file.get())) return ErrnoError("read", path, errno);
  return bytes;
}

absl::Status WriteFile(const std::string& path, absl::string_view bytes) {
  std::unique_ptr<std::FILE, CloseFile> file(std::fopen(path.c_str(), "wb"));
  if (file == nullptr) return ErrnoError("write", path, errno);
  if (std::fwrite(bytes.data(), 1, bytes.size(), file.get()) != bytes.size() ||
      std::fflush(file.get()) != 0) {
    return ErrnoError("write", path, errno);
  }
  return absl::OkStatus();
}

absl::Status SyncToDisk(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open", path, errno);
  const int synced = fsync(fd);
  const int error = errno;
  close(fd);
  return synced == 0 ? absl::OkStatus() : ErrnoError("sync", path, error);
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes) {
  const std::string partial = absl::StrCat(path, ".partial-", getpid(), "-", gettid());
  {
    std::unique_ptr<std::FILE, CloseFile> file(std::fopen(partial.c_str(), "wb"));
    if (file == nullptr) return ErrnoError("write", partial, errno);
    if (std::fwrite(bytes.data(), 1, bytes.size(), file.get()) != bytes.size() ||
        std::fflush(file.get()) != 0 || fsync(fileno(file.get())) != 0) {
      const int error = errno;
      std::remove(partial.c_str());
      return ErrnoError("write", partial, error);
    }
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(partial.c_str());
    return ErrnoError("rename into", path, error);
  }
  return absl::OkStatus();
}

absl::StatusOr<ScratchDir> ScratchDir::Create(absl::string_view prefix) {
  std::error_code error;
  std::filesystem::path tmp = std::filesystem::temp_directory_path(error);
  if (error) tmp = "/tmp";
  std::string path = (tmp / absl::StrCat(prefix, "-XXXXXX")).string();
  if (mkdtemp(path.data()) == nullptr) return ErrnoError("create", path, errno);
  return ScratchDir(std::move(path));
}

ScratchDir& ScratchDir::operator=(ScratchDir&& other) noexcept {
  std::swap(path_, other.path_);
  return *this;
}

ScratchDir::~ScratchDir() {
  std::error_code ignored;
  if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
}

}  // namespace dray
