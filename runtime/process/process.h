// Process: a process dray started, on this machine (Subprocess) or on
// another node through that node's agent (NodePool): what a controller needs
// to watch and stop it, wherever it runs.
//
// Thread-safety: implementations are thread-safe.
#ifndef DRAY_RUNTIME_PROCESS_PROCESS_H_
#define DRAY_RUNTIME_PROCESS_PROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>

#include "absl/time/time.h"

namespace dray {

// ExitStatus: how a process ended.
struct ExitStatus {
  int exit_code = -1;  // set when it exited
  int signal = 0;      // set when a signal killed it
  // Set when the node it ran on was lost: how it ended is unknown.
  bool lost = false;

  // ToString: "exited with code 3", "killed by signal 9 (Killed)" or
  // "was lost with its node".
  std::string ToString() const;
};

class Process {
 public:
  // Destroying a process kills it if it still runs.
  virtual ~Process() = default;

  virtual pid_t pid() const = 0;

  // Describe names the process for errors: "pid 12", or "pid 12 on node2
  // (10.77.0.12)".
  virtual std::string Describe() const = 0;

  // Signal sends `signal` to the process (and its process group) unless it
  // has ended.
  virtual void Signal(int signal) = 0;

  // WaitFor waits up to `timeout` for the process to end.
  virtual std::optional<ExitStatus> WaitFor(absl::Duration timeout) = 0;
};

}  // namespace dray

#endif  // DRAY_RUNTIME_PROCESS_PROCESS_H_
