// Helpers for the runtime's integration tests: where the test worker binary
// is, and a group of test workers.
#ifndef DRAY_TESTS_RUNTIME_TEST_UTIL_H_
#define DRAY_TESTS_RUNTIME_TEST_UTIL_H_

#include <sys/types.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "runtime/controller/worker_group.h"

namespace dray {

// RunfilePath returns the path of `target` (e.g. "tests/runtime/test_workers")
// inside the test's runfiles.
inline std::string RunfilePath(const std::string& target) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr || workspace == nullptr) return target;  // run by hand from the root
  return absl::StrCat(srcdir, "/", workspace, "/", target);
}

// StartGroup starts test worker processes hosting `roles`.
inline absl::StatusOr<std::unique_ptr<WorkerGroup>> StartGroup(
    ResourceSpec resources, std::vector<std::string> roles,
    WorkerGroupOptions options = WorkerGroupOptions()) {
  options.command = {RunfilePath("tests/runtime/test_workers")};
  options.roles = std::move(roles);
  return WorkerGroup::Create(resources, std::move(options));
}

// ProcessState: the state letter and parent of `pid` from /proc (state
// empty once the process is gone).
struct ProcessState {
  std::string state;
  pid_t parent = 0;
};
inline ProcessState StateOf(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string pid_field, name;
  ProcessState process;
  if (!(stat >> pid_field >> name >> process.state >> process.parent)) return {};
  return process;
}

// ProcessAlive is true while `pid` runs (a zombie counts as dead).
inline bool ProcessAlive(pid_t pid) {
  const std::string state = StateOf(pid).state;
  return !state.empty() && state != "Z" && state != "X";
}

// Reaped: `pid` is no child of this process any more, not even a zombie.
inline bool Reaped(pid_t pid) {
  const ProcessState process = StateOf(pid);
  return process.state.empty() || process.parent != getpid();
}

}  // namespace dray

#endif  // DRAY_TESTS_RUNTIME_TEST_UTIL_H_
