// Subprocess: a child process that cannot outlive its parent.
//
// The child is killed (SIGKILL) if the parent dies, is reaped by a thread of
// its own the moment it exits (on_exit then reports how it ended), and its
// stdout and stderr reach the parent's, each line prefixed:
//
//   DRAY_ASSIGN_OR_RETURN(auto child, Subprocess::Spawn(
//       {{"/usr/bin/worker", "--flag"}, {{"RANK", "2"}}, "[rank 2] "},
//       [](const ExitStatus& status) { ... status.ToString() ... }));
//   child->Signal(SIGTERM);
//   std::optional<ExitStatus> status = child->WaitFor(absl::Seconds(5));
//
// The child leads its own process group: Signal reaches its descendants too.
// Destroying a Subprocess kills the child and its group if they still run,
// reaps the child and joins its threads: every process started is reaped.
//
// Thread-safety: thread-safe.
#ifndef DRAY_RUNTIME_PROCESS_SUBPROCESS_H_
#define DRAY_RUNTIME_PROCESS_SUBPROCESS_H_

#include <sys/types.h>

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/process/process.h"

namespace dray {

struct SubprocessOptions {
  std::vector<std::string> argv;  // argv[0] is the path of the executable
  // Variables set in the child on top of this process's environment.
  std::vector<std::pair<std::string, std::string>> env;
  std::string output_prefix;  // prepended to each line of the child's output
  // Set: the child's output goes here (whole lines, prefixed; `to_stderr`
  // tells which stream) instead of to this process's stdout and stderr.
  std::function<void(bool to_stderr, std::string lines)> on_output;
  // What the child reads on its standard input, then end of file (at most
  // 64 KiB: a secret, say, that must not appear on a command line or in the
  // environment). Empty: standard input is /dev/null.
  std::string stdin_data;
};

class Subprocess final : public Process {
 public:
  // Spawn starts the child; an executable that cannot run is an error here,
  // not a silent exit. `on_exit` runs on an internal thread once the child ended.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(
      SubprocessOptions options, std::function<void(const ExitStatus&)> on_exit = nullptr);

  ~Subprocess() override;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const override { return pid_; }

  std::string Describe() const override;

  // Signal sends `signal` to the child's process group unless the child has
  // already been reaped.
  void Signal(int signal) override;

  std::optional<ExitStatus> WaitFor(absl::Duration timeout) override;

 private:
  // Pipes: {read end, write end} of the child's exec status, stdin, stdout,
  // stderr.
  struct Pipes {
    std::array<int, 2> exec_status, in, out, err;
  };

  Subprocess() = default;
  // Watch forks and execs (so the child's parent-death signal is tied to this
  // long-lived thread), reports the outcome of exec, then reaps the child.
  void Watch(SubprocessOptions options, Pipes pipes);
  void ForwardOutput(int stdout_fd, int stderr_fd, std::string prefix,
                     std::function<void(bool, std::string)> on_output);

  pid_t pid_ = -1;
  std::function<void(const ExitStatus&)> on_exit_;
  std::thread watcher_;
  std::thread forwarder_;
  absl::Mutex mu_;
  std::optional<ExitStatus> exit_status_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> spawn_result_ ABSL_GUARDED_BY(mu_);
};

// PickFreePort returns a TCP port on `host` (an IPv4 address) that was free
// a moment ago.
absl::StatusOr<int> PickFreePort(const std::string& host = "127.0.0.1");

// UsableCores: the cores this process may run on (its CPU affinity, which
// Slurm, a cgroup cpuset or taskset may have narrowed), at least 1.
int UsableCores();

// AddCpuShareEnv adds to `env` (a child's, see SubprocessOptions::env) the
// variables that set how a worker computes when `sharing` processes in all
// share this machine's usable cores, each unless this process's
// environment or `env` already sets it: OMP_NUM_THREADS = cores / sharing, as torchrun does (no
// oversubscribed cores), and OMP_WAIT_POLICY=PASSIVE (LibTorch's OpenMP
// threads otherwise spin after each parallel region, on the cores its BLAS's
// own threads multiply on: one edit on 2 cores took 1.8x as long).
void AddCpuShareEnv(int sharing, std::vector<std::pair<std::string, std::string>>& env);

}  // namespace dray

#endif  // DRAY_RUNTIME_PROCESS_SUBPROCESS_H_
