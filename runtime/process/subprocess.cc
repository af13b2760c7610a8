#include "runtime/process/subprocess.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace dray {
namespace {

// How long output is still forwarded after the child ended and went quiet.
constexpr absl::Duration kOutputDrainTime = absl::Milliseconds(100);

// Output lines of all children are written whole, one at a time.
absl::Mutex output_mu(absl::kConstInit);

// A pipe holds at least this much without a reader (Linux: 64 KiB).
constexpr size_t kMaxStdinBytes = size_t{64} << 10;

// WriteAll writes `text` to `fd`; false if the fd failed first.
bool WriteAll(int fd, absl::string_view text) {
  while (!text.empty()) {
    const ssize_t written = write(fd, text.data(), text.size());
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return false;
    text.remove_prefix(written);
  }
  return true;
}

// Environment returns this process's environment with `overrides` applied,
// as KEY=VALUE strings.
std::vector<std::string> Environment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const absl::string_view text(*entry);
    bool overridden = false;
    for (const auto& [key, value] : overrides) {
      overridden |=
          text.size() > key.size() && text.substr(0, key.size()) == key && text[key.size()] == '=';
    }
    if (!overridden) env.emplace_back(text);
  }
  for (const auto& [key, value] : overrides) env.push_back(absl::StrCat(key, "=", value));
  return env;
}

std::vector<char*> Pointers(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// RunChild runs in the forked child: only async-signal-safe calls from here on.
[[noreturn]] void RunChild(pid_t parent, char** argv, char** envp, int exec_status_fd, int stdin_fd,
                           int stdout_fd, int stderr_fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the parent died before prctl
  setpgid(0, 0);                        // its own process group, so signals reach its children too
  dup2(stdin_fd, STDIN_FILENO);
  dup2(stdout_fd, STDOUT_FILENO);
  dup2(stderr_fd, STDERR_FILENO);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);  // do not inherit the parent's blocked signals
  execve(argv[0], argv, envp);
  const int error = errno;
  ssize_t ignored = write(exec_status_fd, &error, sizeof(error));
  (void)ignored;
  _exit(127);
}

}  // namespace

std::string ExitStatus::ToString() const {
  if (lost) return "was lost with its node";
  if (signal != 0) return absl::StrCat("killed by signal ", signal, " (", strsignal(signal), ")");
  return absl::StrCat("exited with code ", exit_code);
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(
    SubprocessOptions options, std::function<void(const ExitStatus&)> on_exit) {
  if (options.argv.empty()) return absl::InvalidArgumentError("a subprocess needs an argv[0]");
  if (options.stdin_data.size() > kMaxStdinBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a subprocess's stdin_data holds at most ", kMaxStdinBytes, " bytes"));
  }
  Pipes pipes;
  for (std::array<int, 2>* pipe : {&pipes.exec_status, &pipes.in, &pipes.out, &pipes.err}) {
    if (pipe2(pipe->data(), O_CLOEXEC) != 0) {
      return absl::ResourceExhaustedError(absl::StrCat("pipe: ", strerror(errno)));
    }
  }
  // The child's whole standard input fits in the pipe: written now, it never blocks.
  const bool written = WriteAll(pipes.in[1], options.stdin_data);
  close(pipes.in[1]);
  if (!written) {
    for (int fd : {pipes.exec_status[0], pipes.exec_status[1], pipes.in[0], pipes.out[0],
                   pipes.out[1], pipes.err[0], pipes.err[1]}) {
      close(fd);
    }
    return absl::UnavailableError(absl::StrCat("writing a subprocess's stdin: ", strerror(errno)));
  }
  std::unique_ptr<Subprocess> process(new Subprocess());
  process->on_exit_ = std::move(on_exit);
  const std::string program = options.argv[0];
  process->watcher_ = std::thread(&Subprocess::Watch, process.get(), std::move(options), pipes);
  absl::Status spawned;
  {
    absl::MutexLock lock(&process->mu_);
    process->mu_.Await(absl::Condition(
        +[](std::optional<absl::Status>* result) { return result->has_value(); },
        &process->spawn_result_));
    spawned = *process->spawn_result_;
  }
  if (!spawned.ok()) {
    process->watcher_.join();
    return absl::Status(spawned.code(),
                        absl::StrCat("cannot run ", program, ": ", spawned.message()));
  }
  return process;
}

void Subprocess::Watch(SubprocessOptions options, Pipes pipes) {
  std::vector<std::string> env = Environment(options.env);
  std::vector<char*> argv = Pointers(options.argv);
  std::vector<char*> envp = Pointers(env);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    RunChild(parent, argv.data(), envp.data(), pipes.exec_status[1], pipes.in[0], pipes.out[1],
             pipes.err[1]);
  }
  close(pipes.in[0]);
  close(pipes.exec_status[1]);
  close(pipes.out[1]);
  close(pipes.err[1]);
  int exec_error = 0;
  ssize_t n;
  do {
    n = read(pipes.exec_status[0], &exec_error, sizeof(exec_error));
  } while (n < 0 && errno == EINTR);
  close(pipes.exec_status[0]);
  absl::Status result = absl::OkStatus();
  if (pid < 0) {
    result = absl::ResourceExhaustedError(absl::StrCat("fork: ", strerror(errno)));
  } else if (n > 0) {
    result = absl::NotFoundError(strerror(exec_error));
    waitpid(pid, nullptr, 0);
  }
  if (!result.ok()) {
    close(pipes.out[0]);
    close(pipes.err[0]);
    absl::MutexLock lock(&mu_);
    spawn_result_ = result;
    return;
  }
  pid_ = pid;
  forwarder_ = std::thread(&Subprocess::ForwardOutput, this, pipes.out[0], pipes.err[0],
                           options.output_prefix, std::move(options.on_output));
  {
    absl::MutexLock lock(&mu_);
    spawn_result_ = absl::OkStatus();
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  ExitStatus exit_status;
  if (WIFSIGNALED(status)) {
    exit_status.signal = WTERMSIG(status);
  } else {
    exit_status.exit_code = WEXITSTATUS(status);
  }
  {
    absl::MutexLock lock(&mu_);
    exit_status_ = exit_status;
  }
  if (on_exit_) on_exit_(exit_status);
}

void Subprocess::ForwardOutput(int stdout_fd, int stderr_fd, std::string prefix,
                               std::function<void(bool, std::string)> on_output) {
  pollfd fds[2] = {{stdout_fd, POLLIN, 0}, {stderr_fd, POLLIN, 0}};
  std::string pending[2];
  const int targets[2] = {STDOUT_FILENO, STDERR_FILENO};
  auto emit = [&](int i, std::string lines) {
    if (on_output) return on_output(i == 1, std::move(lines));
    absl::MutexLock lock(&output_mu);
    WriteAll(targets[i], lines);
  };
  int open_fds = 2;
  char buffer[65536];
  while (open_fds > 0) {
    const int ready = poll(fds, 2, static_cast<int>(absl::ToInt64Milliseconds(kOutputDrainTime)));
    if (ready < 0 && errno != EINTR) break;
    if (ready == 0 && WaitFor(absl::ZeroDuration()).has_value()) {
      // The child is gone and has been quiet for a while; a descendant may
      // still hold the pipes open, but its output is not the child's.
      for (int i = 0; i < 2; ++i) {
        if (fds[i].fd >= 0) close(fds[i].fd);
        if (!pending[i].empty()) pending[i] += '\n';
      }
      for (int i = 0; i < 2; ++i) {
        if (!pending[i].empty()) emit(i, absl::StrCat(prefix, pending[i]));
      }
      return;
    }
    if (ready <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
        if (!pending[i].empty()) pending[i] += '\n';
      } else {
        pending[i].append(buffer, n);
      }
      const size_t end = pending[i].rfind('\n');
      if (end == std::string::npos) continue;
      std::string out;
      size_t start = 0;
      while (start <= end) {
        const size_t newline = pending[i].find('\n', start);
        absl::StrAppend(&out, prefix,
                        absl::string_view(pending[i]).substr(start, newline - start + 1));
        start = newline + 1;
      }
      pending[i].erase(0, end + 1);
      emit(i, std::move(out));
    }
  }
}

std::string Subprocess::Describe() const { return absl::StrCat("pid ", pid_); }

void Subprocess::Signal(int signal) {
  absl::MutexLock lock(&mu_);
  if (!exit_status_.has_value() && pid_ > 0) kill(-pid_, signal);  // the child's whole group
}

std::optional<ExitStatus> Subprocess::WaitFor(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(
      absl::Condition(
          +[](std::optional<ExitStatus>* status) { return status->has_value(); }, &exit_status_),
      timeout);
  return exit_status_;
}

Subprocess::~Subprocess() {
  Signal(SIGKILL);
  if (watcher_.joinable()) watcher_.join();
  // Descendants left in the child's group go too. The group id cannot have
  // been reused while any of them lives, so this reaches only them.
  if (pid_ > 0) kill(-pid_, SIGKILL);
  if (forwarder_.joinable()) forwarder_.join();
}

int UsableCores() {
  cpu_set_t cores;
  CPU_ZERO(&cores);
  if (sched_getaffinity(0, sizeof(cores), &cores) != 0) {
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }
  return std::max(1, CPU_COUNT(&cores));
}

void AddCpuShareEnv(int sharing, std::vector<std::pair<std::string, std::string>>& env) {
  auto add_unset = [&env](const std::string& name, const std::string& value) {
    const bool set = std::getenv(name.c_str()) != nullptr ||
                     std::any_of(env.begin(), env.end(),
                                 [&name](const auto& variable) { return variable.first == name; });
    if (!set) env.emplace_back(name, value);
  };
  add_unset("OMP_NUM_THREADS", absl::StrCat(std::max(1, UsableCores() / std::max(1, sharing))));
  add_unset("OMP_WAIT_POLICY", "PASSIVE");
}

absl::StatusOr<int> PickFreePort(const std::string& host) {
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("'", host, "' is not an IPv4 address"));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", strerror(errno)));
  socklen_t length = sizeof(address);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  close(fd);
  if (!ok)
    return absl::UnavailableError(absl::StrCat("no free port on ", host, ": ", strerror(errno)));
  return static_cast<int>(ntohs(address.sin_port));
}

}  // namespace dray
