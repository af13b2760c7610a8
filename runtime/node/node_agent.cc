#include "runtime/node/node_agent.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "dray/v1/node.grpc.pb.h"
#include "runtime/net/host_address.h"
#include "runtime/process/subprocess.h"
#include "runtime/rpc/grpc_util.h"
#include "runtime/security/job_secret.h"

namespace dray {
namespace {

// How long workers get to exit on SIGTERM before SIGKILL.
constexpr absl::Duration kWorkerTermGrace = absl::Seconds(1);

std::string Hostname() {
  char name[HOST_NAME_MAX + 1] = {};
  return gethostname(name, sizeof(name)) == 0 ? std::string(name) : std::string("unknown");
}

// Agent: one attachment to the controller, from hello to stop.
class Agent {
 public:
  Agent(const NodeAgentOptions& options, std::string address)
      : options_(options), address_(std::move(address)), hostname_(Hostname()) {}

  absl::Status Run();

 private:
  // Worker: a started worker; its pid is known once Spawn returned.
  struct Worker {
    int rank = 0;
    absl::Notification spawned;
    pid_t pid = 0;
  };

  void Send(const v1::NodeToController& message);
  void Launch(const v1::LaunchWorkers& launch);
  absl::StatusOr<int> StartWorker(const v1::LaunchWorkers& launch, const v1::WorkerLaunch& worker,
                                  int master_port);
  void SignalWorkers(const v1::SignalWorkers& signal);
  // WatchController cancels the stream when the controller goes silent.
  void WatchController();
  // KillWorkers ends every worker: SIGTERM, a grace, then SIGKILL; reaped.
  void KillWorkers();
  // ReapEnded forgets workers that have ended.
  void ReapEnded();

  const NodeAgentOptions& options_;
  const std::string address_;
  const std::string hostname_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::NodeToController, v1::ControllerToNode>> stream_;

  absl::Mutex write_mu_;
  bool stream_open_ ABSL_GUARDED_BY(write_mu_) = false;

  absl::Mutex mu_;
  std::map<pid_t, std::unique_ptr<Subprocess>> workers_ ABSL_GUARDED_BY(mu_);
  absl::Time last_heard_ ABSL_GUARDED_BY(mu_);
  std::string lost_cause_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status Agent::Run() {
  std::shared_ptr<grpc::Channel> channel = CreateDrayChannel(options_.controller);
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + options_.attach_timeout))) {
    return absl::UnavailableError(absl::StrCat("could not reach the controller at ",
                                               options_.controller, " within ",
                                               absl::FormatDuration(options_.attach_timeout)));
  }
  AttachJobSecret(&context_, options_.token);
  stream_ = v1::ClusterService::NewStub(channel)->AttachNode(&context_);
  {
    absl::MutexLock lock(&write_mu_);
    stream_open_ = true;
  }
  v1::NodeToController hello;
  hello.mutable_hello()->set_address(address_);
  hello.mutable_hello()->set_hostname(hostname_);
  *hello.mutable_hello()->mutable_gpus() = {options_.gpus.begin(), options_.gpus.end()};
  hello.mutable_hello()->set_pid(getpid());
  hello.mutable_hello()->set_cores(UsableCores());
  Send(hello);
  {
    absl::MutexLock lock(&mu_);
    last_heard_ = absl::Now();
  }
  std::thread watcher([this] { WatchController(); });

  std::string stop_reason;
  v1::ControllerToNode message;
  bool announced = false;
  while (stop_reason.empty() && stream_->Read(&message)) {
    if (!announced) {
      Log("node", absl::StrCat("attached to the controller at ", options_.controller, " as ",
                               hostname_, " (", address_, ")"));
      announced = true;
    }
    {
      absl::MutexLock lock(&mu_);
      last_heard_ = absl::Now();
    }
    switch (message.kind_case()) {
      case v1::ControllerToNode::kLaunch:
        Launch(message.launch());
        break;
      case v1::ControllerToNode::kSignal:
        SignalWorkers(message.signal());
        break;
      case v1::ControllerToNode::kStop:
        stop_reason = message.stop();
        break;
      default:
        break;  // a ping
    }
  }
  std::string lost_cause;
  {
    absl::MutexLock lock(&mu_);
    done_ = true;
    lost_cause = lost_cause_;
  }
  watcher.join();
  KillWorkers();
  {
    absl::MutexLock lock(&write_mu_);
    stream_open_ = false;
  }
  // Told to stop, the agent ends the call; otherwise it has ended, and
  // Finish says how (a refused token, the controller's death).
  if (!stop_reason.empty()) context_.TryCancel();
  const grpc::Status finished = stream_->Finish();
  if (!stop_reason.empty()) {
    Log("node", absl::StrCat("stopped: ", stop_reason));
    return absl::OkStatus();
  }
  if (finished.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    return ToAbslStatus(finished, absl::StrCat("attaching to ", options_.controller));
  }
  return absl::UnavailableError(absl::StrCat(
      "the controller at ", options_.controller, " went away (",
      lost_cause.empty() ? finished.error_message() : lost_cause, "); its workers are killed"));
}

void Agent::Send(const v1::NodeToController& message) {
  absl::MutexLock lock(&write_mu_);
  if (stream_open_) stream_->Write(message);
}

void Agent::Launch(const v1::LaunchWorkers& launch) {
  ReapEnded();
  v1::NodeToController reply;
  v1::WorkersLaunched* launched = reply.mutable_launched();
  launched->set_launch_id(launch.launch_id());
  absl::StatusOr<int> master_port = launch.master_port();
  if (*master_port == 0) {
    absl::StatusOr<std::string> bind_address = ResolveIPv4(address_);
    master_port = bind_address.ok() ? PickFreePort(*bind_address) : bind_address.status();
  }
  for (int i = 0; master_port.ok() && i < launch.workers_size(); ++i) {
    absl::StatusOr<int> pid = StartWorker(launch, launch.workers(i), *master_port);
    if (!pid.ok()) {  // all or nothing: kill those started
      v1::SignalWorkers kill;
      *kill.mutable_pids() = launched->pids();
      kill.set_signal(SIGKILL);
      SignalWorkers(kill);
      launched->clear_pids();
      launched->set_error(pid.status().ToString());
      break;
    }
    launched->add_pids(*pid);
  }
  if (!master_port.ok()) launched->set_error(master_port.status().ToString());
  if (master_port.ok()) launched->set_master_port(*master_port);
  Send(reply);
}

absl::StatusOr<int> Agent::StartWorker(const v1::LaunchWorkers& launch,
                                       const v1::WorkerLaunch& worker, int master_port) {
  SubprocessOptions spawn;
  spawn.argv = options_.worker_command;
  spawn.argv.insert(spawn.argv.end(), worker.args().begin(), worker.args().end());
  spawn.argv.push_back(absl::StrCat("--host=", address_));
  spawn.env.assign(worker.env().begin(), worker.env().end());
  spawn.env.emplace_back("MASTER_PORT", absl::StrCat(master_port));
  spawn.env.emplace_back("DRAY_NODE_ADDR", address_);
  if (!options_.gpus.empty()) {
    if (worker.gpu() < 0 || worker.gpu() >= static_cast<int>(options_.gpus.size())) {
      return absl::FailedPreconditionError(absl::StrCat("rank ", worker.rank(), " asks for GPU #",
                                                        worker.gpu(), ": this node has ",
                                                        options_.gpus.size()));
    }
    spawn.env.emplace_back("CUDA_VISIBLE_DEVICES", options_.gpus[worker.gpu()]);
  }
  int local_world_size = 1;  // the node's workers share its cores
  if (auto found = worker.env().find("LOCAL_WORLD_SIZE"); found != worker.env().end())
    local_world_size = std::max(1, std::atoi(found->second.c_str()));
  AddCpuShareEnv(local_world_size, spawn.env);
  spawn.output_prefix = absl::StrCat("[rank ", worker.rank(), " ", hostname_, "] ");
  spawn.on_output = [this, rank = worker.rank()](bool to_stderr, std::string lines) {
    v1::NodeToController output;
    output.mutable_output()->set_rank(rank);
    output.mutable_output()->set_stderr(to_stderr);
    output.mutable_output()->set_text(std::move(lines));
    Send(output);
  };
  spawn.stdin_data = launch.job_secret();
  auto record = std::make_shared<Worker>();
  record->rank = worker.rank();
  DRAY_ASSIGN_OR_RETURN(
      std::unique_ptr<Subprocess> process,
      Subprocess::Spawn(std::move(spawn), [this, record](const ExitStatus& status) {
        record->spawned.WaitForNotification();
        v1::NodeToController exited;
        exited.mutable_exited()->set_rank(record->rank);
        exited.mutable_exited()->set_pid(record->pid);
        exited.mutable_exited()->set_exit_code(status.exit_code);
        exited.mutable_exited()->set_signal(status.signal);
        Send(exited);
      }));
  record->pid = process->pid();
  record->spawned.Notify();
  absl::MutexLock lock(&mu_);
  workers_[record->pid] = std::move(process);
  return record->pid;
}

void Agent::SignalWorkers(const v1::SignalWorkers& signal) {
  absl::MutexLock lock(&mu_);
  for (int64_t pid : signal.pids()) {
    auto found = workers_.find(static_cast<pid_t>(pid));
    if (found != workers_.end()) found->second->Signal(signal.signal());
  }
}

void Agent::WatchController() {
  v1::NodeToController ping;
  ping.set_ping(true);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&done_), options_.heartbeat_interval)) return;
      const absl::Duration silence = absl::Now() - last_heard_;
      if (silence > options_.controller_timeout) {
        lost_cause_ = absl::StrCat("it sent nothing for ", absl::FormatDuration(silence));
        context_.TryCancel();
        return;
      }
    }
    Send(ping);
  }
}

void Agent::KillWorkers() {
  std::map<pid_t, std::unique_ptr<Subprocess>> workers;
  {
    absl::MutexLock lock(&mu_);
    workers.swap(workers_);
  }
  int running = 0;
  for (auto& [pid, worker] : workers) {
    if (worker->WaitFor(absl::ZeroDuration()).has_value()) continue;
    worker->Signal(SIGTERM);
    ++running;
  }
  if (running > 0) Log("node", absl::StrCat("stopping ", running, " running workers"));
  const absl::Time deadline = absl::Now() + kWorkerTermGrace;
  for (auto& [pid, worker] : workers) worker->WaitFor(deadline - absl::Now());
  workers.clear();  // SIGKILL what is left, reap
}

void Agent::ReapEnded() {
  std::vector<std::unique_ptr<Subprocess>> ended;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (it->second->WaitFor(absl::ZeroDuration()).has_value()) {
        ended.push_back(std::move(it->second));
        it = workers_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

}  // namespace

absl::Status RunNodeAgent(const NodeAgentOptions& options) {
  if (options.controller.empty())
    return absl::InvalidArgumentError("a node agent needs the controller's HOST:PORT");
  if (options.token.empty())
    return absl::InvalidArgumentError("a node agent needs the cluster token");
  if (options.worker_command.empty())
    return absl::InvalidArgumentError("a node agent needs a worker command");
  std::string address = options.address;
  if (address.empty()) {
    DRAY_ASSIGN_OR_RETURN(address, LocalAddressToward(options.controller));
  }
  Agent agent(options, address);
  return agent.Run();
}

}  // namespace dray
