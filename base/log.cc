#include "base/log.h"

#include <unistd.h>

#include <cerrno>

#include <string>

#include "absl/strings/str_cat.h"

namespace dray {

void Log(absl::string_view component, absl::string_view message) {
  const std::string line = absl::StrCat("dray ", component, ": ", message, "\n");
  // write(2), not stdio: one call per line, whatever stderr's buffering.
  size_t written = 0;
  while (written < line.size()) {
    const ssize_t n = write(STDERR_FILENO, line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr closed: a log line is not worth failing for
    written += static_cast<size_t>(n);
  }
}

}  // namespace dray
