// Whole-file reading and writing with errors that name the file.
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

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dray {

// ReadFile returns the bytes of the file at `path`.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// WriteFile replaces the file at `path` with `bytes`.
absl::Status WriteFile(const std::string& path, absl::string_view bytes);

}  // namespace dray

#endif  // DRAY_BASE_FILES_H_
