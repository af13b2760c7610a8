// Whole-file reading and writing with errors that name the file, and
// private scratch directories.
//
//   DRAY_ASSIGN_OR_RETURN(std::string bytes, ReadFile("docs/example.png"));
//   DRAY_RETURN_IF_ERROR(WriteFile("/tmp/out.png", png));
//
// Errors: NOT_FOUND for a file that does not exist, PERMISSION_DENIED when it
// may not be read or written, UNAVAILABLE for any other I/O failure; the
// message names the path and the system's reason.
//
// Thread-safety: stateless functions.
#ifndef DRAY_BASE_FILES_H_
#define DRAY_BASE_FILES_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dray {

// ReadFile returns the bytes of the file at `path`.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// WriteFile replaces the file at `path` with `bytes`.
absl::Status WriteFile(const std::string& path, absl::string_view bytes);

// SyncToDisk makes the file or directory at `path` durable (fsync): a
// file's contents, or a directory's entries (a rename inside it).
absl::Status SyncToDisk(const std::string& path);

// WriteFileAtomically replaces the file at `path` with `bytes` all at once:
// written and synced beside it, then renamed over it, so that a reader (or
// a crash) sees the old file or the new one, never a part; writers of the
// same bytes may race.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes);

// ScratchDir: a new directory under $TMPDIR (or /tmp) that only this user
// may enter (mode 0700), removed with its contents when the ScratchDir goes.
class ScratchDir {
 public:
  // Create makes `<tmp>/<prefix>-XXXXXX`.
  static absl::StatusOr<ScratchDir> Create(absl::string_view prefix);

  ScratchDir(ScratchDir&& other) noexcept : path_(std::exchange(other.path_, "")) {}
  ScratchDir& operator=(ScratchDir&& other) noexcept;
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir();

  const std::string& path() const { return path_; }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace dray

#endif  // DRAY_BASE_FILES_H_
