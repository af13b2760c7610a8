#include "runtime/controller/worker_group.h"

#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <thread>

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "dray/v1/controller.grpc.pb.h"
#include "dray/v1/worker.grpc.pb.h"
#include "runtime/controller/worker_client.h"
#include "runtime/net/host_address.h"
#include "runtime/process/subprocess.h"
#include "runtime/rpc/grpc_util.h"
#include "runtime/security/job_secret.h"
#include "runtime/security/tls.h"
#include "runtime/transport/segment_passage.h"

namespace dray {
namespace {

// How long a broken session waits for the process's exit status, which
// makes a better error than the broken stream.
constexpr absl::Duration kExitStatusWait = absl::Milliseconds(500);
constexpr absl::Duration kShutdownRpcTimeout = absl::Seconds(1);
// How long workers asked to shut down get to exit before SIGTERM.
constexpr absl::Duration kWorkerExitGrace = absl::Seconds(5);
constexpr absl::Duration kTermGrace = absl::Seconds(2);

}  // namespace

// Impl: the controller's service (registration, heartbeats), the worker
// processes and the sessions to them.
class WorkerGroup::Impl final : public v1::ControllerService::Service {
 public:
  Impl(const ResourceSpec& resources, WorkerGroupOptions options)
      : resources_(resources),
        options_(std::move(options)),
        registrations_(resources.world_size()),
        exits_(resources.world_size()),
        heartbeats_(resources.world_size()) {}

  ~Impl() override { Stop(); }

  // Start brings the group up: controller server, processes, registration,
  // sessions.
  absl::Status Start();

  // Stop shuts everything down and reaps every process.
  void Stop();
  // Abort fails the group with `why` (if it has not failed yet), then stops
  // it: a failed group's processes are killed at once.
  void Abort(const absl::Status& why) {
    bool connected;
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_) return;
      if (!failure_.has_value()) failure_ = why;
      connected = connected_;
    }
    if (connected) {
      for (auto& client : clients_) client->Fail(why);
    }
    Stop();
  }

  void CancelCalls(const absl::Status& why) {
    {
      absl::MutexLock lock(&mu_);
      if (!connected_ || shutting_down_) return;
    }
    for (auto& client : clients_) client->CancelPending(why);
  }

  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  bool stopped() {
    absl::MutexLock lock(&mu_);
    return shutting_down_;
  }
  WorkerClient* client(int rank) { return clients_[rank].get(); }
  absl::Duration call_timeout() const { return options_.call_timeout; }
  const v1::MethodTable& table(int rank) {
    absl::MutexLock lock(&mu_);
    return registrations_[rank]->methods();
  }
  std::vector<std::string> worker_addresses() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> addresses;
    for (const auto& registration : registrations_) addresses.push_back(registration->address());
    return addresses;
  }
  std::vector<RankMemory> memory() const {
    absl::MutexLock lock(&mu_);  // Shutdown may be closing the clients
    std::vector<RankMemory> ranks;
    for (const auto& client : clients_) {
      const std::optional<v1::ProcessMemory> memory = client->memory();
      ranks.push_back(memory.has_value() ? RankMemory{true, memory->resident_bytes(),
                                                      memory->device_allocated_bytes()}
                                         : RankMemory{});
    }
    return ranks;
  }
  std::vector<std::string> call_addresses() const {
    std::vector<std::string> addresses;
    for (const auto& client : clients_) addresses.push_back(client->address());
    return addresses;
  }
  const std::string& controller_address() const { return controller_address_; }
  const std::string& job_secret() const { return job_secret_; }
  absl::Status Health(absl::Duration wait_for_failure = absl::ZeroDuration()) {
    absl::MutexLock lock(&mu_);
    if (wait_for_failure > absl::ZeroDuration()) {  // not on the hot path of every call
      auto unhealthy = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !HealthLocked().ok(); };
      mu_.AwaitWithTimeout(absl::Condition(&unhealthy), wait_for_failure);
    }
    return HealthLocked();
  }
  absl::Status HealthLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (shutting_down_) return absl::UnavailableError("the worker group has shut down");
    if (failure_.has_value()) return *failure_;
    for (int rank = 0; rank < static_cast<int>(exits_.size()); ++rank) {
      if (exits_[rank].has_value()) {
        return absl::UnavailableError(absl::StrCat("worker rank ", rank, " (",
                                                   processes_[rank]->Describe(), ") ",
                                                   exits_[rank]->ToString()));
      }
    }
    return absl::OkStatus();
  }
  std::vector<pid_t> pids() const {
    std::vector<pid_t> pids;
    for (const auto& process : processes_) pids.push_back(process ? process->pid() : -1);
    return pids;
  }

 private:
  absl::Status StartServer();
  // Launch starts every rank: here (Spawn) or on the pool's nodes.
  absl::Status Launch();
  absl::Status Spawn(int rank);
  // WorkerArgs: what follows the worker command on every rank's command line.
  std::vector<std::string> WorkerArgs() const {
    return {absl::StrCat("--controller=", controller_address_),
            absl::StrCat("--roles=", absl::StrJoin(options_.roles, ","))};
  }
  absl::Status WaitForRegistration();
  absl::Status Connect();
  void OnWorkerExit(int rank, const ExitStatus& status);
  void OnWorkerLost(int rank, const absl::Status& cause);
  // FailRank fails `rank`'s calls and, the first time, the group.
  void FailRank(int rank, const absl::Status& cause);
  // WatchHeartbeats fails the first rank silent for stall_timeout.
  void WatchHeartbeats();

  const ResourceSpec resources_;
  const WorkerGroupOptions options_;
  std::unique_ptr<grpc::Server> server_;
  std::string controller_address_;
  std::optional<ScratchDir> store_dir_;  // where the ranks meet for collectives
  const std::string job_secret_ = NewJobSecret();
  std::vector<std::unique_ptr<Process>> processes_;     // by rank
  std::vector<std::unique_ptr<WorkerClient>> clients_;  // by rank

  mutable absl::Mutex mu_;
  std::vector<std::optional<v1::RegisterWorkerRequest>> registrations_ ABSL_GUARDED_BY(mu_);
  std::vector<std::optional<ExitStatus>> exits_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> heartbeats_ ABSL_GUARDED_BY(mu_);   // by rank: the last one
  std::optional<absl::Status> failure_ ABSL_GUARDED_BY(mu_);  // the group's first
  std::thread heartbeat_watcher_;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status WorkerGroup::Impl::Start() {
  if (resources_.nodes < 1 || resources_.workers_per_node < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a worker group needs at least one node and one worker per node, got ",
                     resources_.nodes, " x ", resources_.workers_per_node));
  }
  if (options_.command.empty() && options_.nodes == nullptr)
    return absl::InvalidArgumentError("WorkerGroupOptions.command is empty");
  if (options_.roles.empty())
    return absl::InvalidArgumentError("WorkerGroupOptions.roles is empty");
  DRAY_RETURN_IF_ERROR(StartServer());
  DRAY_RETURN_IF_ERROR(Launch());
  DRAY_RETURN_IF_ERROR(WaitForRegistration());
  return Connect();
}

absl::Status WorkerGroup::Impl::Launch() {
  if (options_.nodes == nullptr) {
    DRAY_ASSIGN_OR_RETURN(store_dir_, ScratchDir::Create("dray-group"));
    processes_.resize(resources_.world_size());
    for (int rank = 0; rank < resources_.world_size(); ++rank) DRAY_RETURN_IF_ERROR(Spawn(rank));
    return absl::OkStatus();
  }
  NodeLaunch launch;
  launch.nodes = resources_.nodes;
  launch.workers_per_node = resources_.workers_per_node;
  launch.args = WorkerArgs();
  launch.env = options_.env;
  launch.first_gpu = options_.first_gpu;
  launch.job_secret = job_secret_;
  launch.wait_for_nodes = options_.register_timeout;
  DRAY_ASSIGN_OR_RETURN(
      processes_,
      options_.nodes->Launch(
          launch, [this](int rank, const ExitStatus& status) { OnWorkerExit(rank, status); },
          [this](int rank, const absl::Status& cause) { OnWorkerLost(rank, cause); }));
  return absl::OkStatus();
}

absl::Status WorkerGroup::Impl::StartServer() {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  ConfigureDrayServer(&builder);
  const std::string host = options_.nodes != nullptr ? options_.nodes->host() : "127.0.0.1";
  DRAY_ASSIGN_OR_RETURN(const std::string bind_address, ResolveIPv4(host));
  int port = 0;
  builder.AddListeningPort(absl::StrCat(bind_address, ":0"), DrayServerCredentials(), &port);
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0)
    return absl::UnavailableError(absl::StrCat("the controller cannot listen on ", host));
  controller_address_ = absl::StrCat(host, ":", port);
  return absl::OkStatus();
}

absl::Status WorkerGroup::Impl::Spawn(int rank) {
  const int local_rank = rank % resources_.workers_per_node;
  SubprocessOptions spawn;
  spawn.argv = options_.command;
  for (std::string& arg : WorkerArgs()) spawn.argv.push_back(std::move(arg));
  spawn.env = {{"RANK", absl::StrCat(rank)},
               {"WORLD_SIZE", absl::StrCat(resources_.world_size())},
               {"LOCAL_RANK", absl::StrCat(local_rank)},
               {"LOCAL_WORLD_SIZE", absl::StrCat(resources_.workers_per_node)},
               {"MASTER_ADDR", options_.master_addr},
               {"DRAY_STORE_FILE", store_dir_->path() + "/store"},
               {"CUDA_VISIBLE_DEVICES", absl::StrCat(options_.first_gpu + local_rank)}};
  spawn.env.insert(spawn.env.end(), options_.env.begin(), options_.env.end());
  AddCpuShareEnv(options_.processes_sharing_cores > 0 ? options_.processes_sharing_cores
                                                      : resources_.workers_per_node,
                 spawn.env);
  spawn.output_prefix =
      absl::StrCat("[", options_.label, options_.label.empty() ? "" : " ", "rank ", rank, "] ");
  spawn.stdin_data = job_secret_;  // never on the command line or in the environment
  DRAY_ASSIGN_OR_RETURN(processes_[rank],
                        Subprocess::Spawn(std::move(spawn), [this, rank](const ExitStatus& status) {
                          OnWorkerExit(rank, status);
                        }));
  return absl::OkStatus();
}

absl::Status WorkerGroup::Impl::WaitForRegistration() {
  const absl::Time deadline = absl::Now() + options_.register_timeout;
  absl::MutexLock lock(&mu_);
  auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t rank = 0; rank < registrations_.size(); ++rank) {
      if (exits_[rank].has_value()) return true;  // fail fast
      if (!registrations_[rank].has_value()) return false;
    }
    return true;
  };
  mu_.AwaitWithDeadline(absl::Condition(&settled), deadline);
  std::vector<int> missing;
  for (size_t rank = 0; rank < registrations_.size(); ++rank) {
    if (exits_[rank].has_value() && !registrations_[rank].has_value()) {
      return absl::UnavailableError(
          absl::StrCat("worker rank ", rank, " (", processes_[rank]->Describe(), ") ",
                       exits_[rank]->ToString(), " before registering (its output is above)"));
    }
    if (!registrations_[rank].has_value()) missing.push_back(static_cast<int>(rank));
  }
  if (!missing.empty()) {
    return absl::DeadlineExceededError(
        absl::StrCat("worker rank", missing.size() > 1 ? "s " : " ", absl::StrJoin(missing, ", "),
                     " did not register within ", absl::FormatDuration(options_.register_timeout)));
  }
  const std::string rank0_table = registrations_[0]->methods().SerializeAsString();
  for (size_t rank = 1; rank < registrations_.size(); ++rank) {
    v1::MethodTable table = registrations_[rank]->methods();
    table.set_rank(0);
    if (table.SerializeAsString() != rank0_table) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker rank ", rank, " registered a method table that differs from rank 0's"));
    }
  }
  return absl::OkStatus();
}

absl::Status WorkerGroup::Impl::Connect() {
  const char* forced = std::getenv("DRAY_TRANSPORT");
  const bool same_node_sockets = options_.transport == WorkerGroupOptions::Transport::kAuto &&
                                 (forced == nullptr || std::string(forced) != "tcp");
  const std::string node_id = LocalNodeId();
  std::vector<WorkerEndpoint> endpoints(resources_.world_size());
  {
    absl::MutexLock lock(&mu_);
    for (int rank = 0; rank < resources_.world_size(); ++rank) {
      const v1::RegisterWorkerRequest& registration = *registrations_[rank];
      WorkerEndpoint& endpoint = endpoints[rank];
      endpoint.address = registration.address();
      if (!same_node_sockets || node_id.empty() || registration.node_id() != node_id) continue;
      endpoint.local_address = registration.local_address();
      if (!registration.segment_address().empty()) {
        DRAY_ASSIGN_OR_RETURN(endpoint.segments,
                              SegmentPassage::Connect(registration.segment_address(), job_secret_));
      }
    }
  }
  for (int rank = 0; rank < resources_.world_size(); ++rank) {
    // A broken session usually means a dead process: report its exit status,
    // a better reason than the broken stream, if it arrives in time.
    clients_.push_back(std::make_unique<WorkerClient>(
        rank, std::move(endpoints[rank]), job_secret_, [this, rank](const absl::Status& lost) {
          if (auto status = processes_[rank]->WaitFor(kExitStatusWait)) {
            OnWorkerExit(rank, *status);
          } else {
            FailRank(rank, lost);
          }
        }));
  }
  {
    absl::MutexLock lock(&mu_);
    connected_ = true;
    std::fill(heartbeats_.begin(), heartbeats_.end(), absl::Now());
  }
  heartbeat_watcher_ = std::thread([this] { WatchHeartbeats(); });
  for (auto& client : clients_) DRAY_RETURN_IF_ERROR(client->Open());
  // A worker that died before its client existed fails its client now.
  for (int rank = 0; rank < resources_.world_size(); ++rank) {
    if (auto status = processes_[rank]->WaitFor(absl::ZeroDuration())) OnWorkerExit(rank, *status);
  }
  return absl::OkStatus();
}

void WorkerGroup::Impl::OnWorkerExit(int rank, const ExitStatus& status) {
  {
    absl::MutexLock lock(&mu_);
    exits_[rank] = status;
    // Until the group is connected, Start reports exits (and processes_ may
    // still be filling in).
    if (!connected_) return;
  }
  FailRank(rank,
           absl::UnavailableError(absl::StrCat(
               "worker rank ", rank, " (", processes_[rank]->Describe(), ") ", status.ToString())));
}

void WorkerGroup::Impl::OnWorkerLost(int rank, const absl::Status& cause) {
  {
    absl::MutexLock lock(&mu_);
    exits_[rank] = ExitStatus{-1, 0, /*lost=*/true};
  }
  FailRank(rank, cause);
}

void WorkerGroup::Impl::FailRank(int rank, const absl::Status& cause) {
  bool first;
  {
    absl::MutexLock lock(&mu_);
    if (!connected_ || shutting_down_) return;  // Start reports it, or nobody needs to know
    first = !failure_.has_value();
    if (first) failure_ = cause;
  }
  clients_[rank]->Fail(cause);
  if (!first) return;
  // The group is done for: the other ranks' calls fail with its cause too,
  // rather than as cancelled when the group is shut down.
  for (auto& client : clients_) client->Fail(cause);
  if (options_.on_failure) options_.on_failure(cause);
}

void WorkerGroup::Impl::WatchHeartbeats() {
  std::optional<std::pair<int, absl::Duration>> stalled;  // rank, silence
  {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return shutting_down_ || failure_.has_value();
    };
    while (!stalled.has_value() &&
           !mu_.AwaitWithTimeout(absl::Condition(&done), options_.heartbeat_interval)) {
      const absl::Time now = absl::Now();
      for (int rank = 0; rank < static_cast<int>(heartbeats_.size()) && !stalled; ++rank) {
        if (now - heartbeats_[rank] > options_.stall_timeout)
          stalled = {rank, now - heartbeats_[rank]};
      }
    }
  }
  if (!stalled.has_value()) return;
  const auto [rank, silence] = *stalled;
  FailRank(rank,
           absl::UnavailableError(absl::StrCat(
               "worker rank ", rank, " (", processes_[rank]->Describe(), ") sent no heartbeat for ",
               absl::FormatDuration(silence), ": stalled or unreachable")));
}

grpc::Status WorkerGroup::Impl::RegisterWorker(grpc::ServerContext* context,
                                               const v1::RegisterWorkerRequest* request,
                                               v1::RegisterWorkerResponse* response) {
  if (absl::Status allowed = CheckJobSecret(*context, job_secret_); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  absl::MutexLock lock(&mu_);
  const int rank = request->rank();
  if (rank < 0 || rank >= static_cast<int>(registrations_.size())) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("rank ", rank, " is outside this group of ", registrations_.size()));
  }
  if (registrations_[rank].has_value()) {
    return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                        absl::StrCat("rank ", rank, " registered twice"));
  }
  registrations_[rank] = *request;
  response->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  return grpc::Status::OK;
}

grpc::Status WorkerGroup::Impl::Heartbeat(grpc::ServerContext* context,
                                          const v1::HeartbeatRequest* request,
                                          v1::HeartbeatResponse* response) {
  if (absl::Status allowed = CheckJobSecret(*context, job_secret_); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  absl::MutexLock lock(&mu_);
  if (request->rank() >= 0 && request->rank() < static_cast<int>(heartbeats_.size()))
    heartbeats_[request->rank()] = absl::Now();
  response->set_keep_running(!shutting_down_);
  return grpc::Status::OK;
}

void WorkerGroup::Impl::Stop() {
  std::vector<std::string> addresses;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;  // heartbeats now tell workers to exit
    // A failed group's ranks may be stopped, or stuck in a collective that
    // waits for a dead peer: nothing to ask politely, nothing to save.
    const bool failed = failure_.has_value();
    for (size_t rank = 0; rank < registrations_.size(); ++rank) {
      if (failed) {
        if (rank < processes_.size() && processes_[rank] != nullptr)
          processes_[rank]->Signal(SIGKILL);
      } else if (registrations_[rank].has_value()) {
        addresses.push_back(registrations_[rank]->address());
      } else if (rank < processes_.size() && processes_[rank] != nullptr) {
        processes_[rank]->Signal(SIGTERM);  // never registered: nothing to ask politely
      }
    }
  }
  if (heartbeat_watcher_.joinable()) heartbeat_watcher_.join();
  for (auto& client : clients_) client->Close();
  for (const std::string& address : addresses) {
    grpc::ClientContext rpc;
    SetDeadline(&rpc, kShutdownRpcTimeout);
    AttachJobSecret(&rpc, job_secret_);
    v1::ShutdownRequest request;
    request.set_reason("the worker group is shutting down");
    v1::ShutdownResponse response;
    v1::WorkerService::NewStub(CreateDrayChannel(address))->Shutdown(&rpc, request, &response);
  }
  const absl::Time deadline = absl::Now() + kWorkerExitGrace;
  for (auto& process : processes_) {
    if (process == nullptr || process->WaitFor(deadline - absl::Now()).has_value()) continue;
    process->Signal(SIGTERM);
    process->WaitFor(kTermGrace);
  }
  processes_.clear();  // kills what is left, reaps, joins
  store_dir_.reset();
  std::vector<std::unique_ptr<WorkerClient>> closing;
  {
    absl::MutexLock lock(&mu_);
    closing.swap(clients_);
  }
  closing.clear();  // outside the lock: closing joins threads that may take it
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
}

WorkerGroup::WorkerGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

WorkerGroup::~WorkerGroup() { Shutdown(); }

absl::StatusOr<std::unique_ptr<WorkerGroup>> WorkerGroup::Create(const ResourceSpec& resources,
                                                                 WorkerGroupOptions options) {
  auto impl = std::make_unique<Impl>(resources, std::move(options));
  DRAY_RETURN_IF_ERROR(impl->Start());  // on error, ~Impl reaps what started
  std::unique_ptr<WorkerGroup> group(new WorkerGroup(std::move(impl)));
  const v1::MethodTable& table = group->impl_->table(0);
  std::vector<WorkerConnection*> workers;
  for (int rank = 0; rank < resources.world_size(); ++rank)
    workers.push_back(group->impl_->client(rank));
  group->dispatcher_ = std::make_unique<MethodDispatcher>(
      std::vector<v1::MethodInfo>(table.methods().begin(), table.methods().end()),
      std::move(workers));
  return group;
}

void WorkerGroup::Shutdown() { impl_->Stop(); }

void WorkerGroup::CancelCalls(const absl::Status& why) { impl_->CancelCalls(why); }

void WorkerGroup::Abort(const absl::Status& why) { impl_->Abort(why); }

std::vector<pid_t> WorkerGroup::pids() const { return impl_->pids(); }

std::vector<RankMemory> WorkerGroup::memory() const { return impl_->memory(); }

absl::Status WorkerGroup::Health() const { return impl_->Health(); }

absl::Status WorkerGroup::HealthAfterFailure(absl::Duration timeout) const {
  return impl_->Health(timeout);
}

std::vector<std::string> WorkerGroup::worker_addresses() const { return impl_->worker_addresses(); }

std::vector<std::string> WorkerGroup::call_addresses() const { return impl_->call_addresses(); }

std::string WorkerGroup::controller_address() const { return impl_->controller_address(); }

const std::string& WorkerGroup::job_secret() const { return impl_->job_secret(); }

GroupFuture WorkerGroup::Invoke(absl::string_view method, std::vector<DataProto> inputs,
                                const CallOptions& options) {
  if (impl_->stopped()) {
    return GroupFuture::Failed(absl::FailedPreconditionError("the worker group has shut down"));
  }
  if (absl::Status health = impl_->Health(); !health.ok()) return GroupFuture::Failed(health);
  const absl::Time deadline = absl::Now() + options.timeout.value_or(impl_->call_timeout());
  return dispatcher_->Invoke(method, std::move(inputs), deadline, options);
}

absl::StatusOr<std::vector<DataProto>> WorkerGroup::Call(absl::string_view method,
                                                         std::vector<DataProto> inputs,
                                                         const CallOptions& options) {
  return Invoke(method, std::move(inputs), options).Get();
}

}  // namespace dray
