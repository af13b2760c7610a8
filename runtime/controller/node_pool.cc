#include "runtime/controller/node_pool.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <thread>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "dray/v1/node.grpc.pb.h"
#include "runtime/net/host_address.h"
#include "runtime/rpc/grpc_util.h"
#include "runtime/security/job_secret.h"
#include "runtime/security/tls.h"

namespace dray {
namespace {

using NodeStream = grpc::ServerReaderWriter<v1::ControllerToNode, v1::NodeToController>;

// WriteOutput writes a worker's forwarded lines to this process's stdout or
// stderr, whole, one chunk at a time.
void WriteOutput(bool to_stderr, const std::string& text) {
  static absl::Mutex mu(absl::kConstInit);
  absl::MutexLock lock(&mu);
  std::fwrite(text.data(), 1, text.size(), to_stderr ? stderr : stdout);
  std::fflush(to_stderr ? stderr : stdout);
}

std::string RankList(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
}

// RemoteWorker: one worker process on a node, as the pool tracks it.
struct RemoteWorker {
  RemoteWorker(int rank, pid_t pid, NodePool::ExitCallback on_exit, NodePool::LossCallback on_lost)
      : rank(rank), pid(pid), on_exit(std::move(on_exit)), on_lost(std::move(on_lost)) {}

  const int rank;
  const pid_t pid;
  std::optional<ExitStatus> exit;  // guarded by the pool's mutex
  // Held while a callback runs: the handle's owner clears them under it, so
  // that none runs once the handle is gone (as Subprocess joins its thread).
  absl::Mutex callback_mu;
  NodePool::ExitCallback on_exit ABSL_GUARDED_BY(callback_mu);
  NodePool::LossCallback on_lost ABSL_GUARDED_BY(callback_mu);
};

// PendingLaunch: workers a node was asked to start, until it answers.
struct PendingLaunch {
  std::vector<int> ranks;
  NodePool::ExitCallback on_exit;
  NodePool::LossCallback on_lost;
  std::optional<v1::WorkersLaunched> reply;
  std::vector<std::shared_ptr<RemoteWorker>> workers;  // made from the reply
};

// Node: an attached agent. Its stream and context live as long as its
// AttachNode handler runs; write_mu keeps them from being used after.
struct Node {
  int64_t id = 0;
  NodeInfo info;
  // Guarded by the pool's mutex.
  absl::Time last_heard;
  bool lost = false;
  std::map<pid_t, std::shared_ptr<RemoteWorker>> workers;  // those still running
  std::map<int64_t, PendingLaunch> launches;

  absl::Mutex write_mu;
  NodeStream* stream ABSL_GUARDED_BY(write_mu) = nullptr;
  grpc::ServerContext* context ABSL_GUARDED_BY(write_mu) = nullptr;

  bool Send(const v1::ControllerToNode& message) {
    absl::MutexLock lock(&write_mu);
    return stream != nullptr && stream->Write(message);
  }
  void Cancel() {
    absl::MutexLock lock(&write_mu);
    if (context != nullptr) context->TryCancel();
  }
};

}  // namespace

std::string NodeInfo::Describe() const { return absl::StrCat(hostname, " (", address, ")"); }

class NodePool::Impl final : public v1::ClusterService::Service {
 public:
  explicit Impl(NodePoolOptions options) : options_(std::move(options)) {}
  ~Impl() override { Stop(); }

  absl::Status Start();
  void Stop();

  grpc::Status AttachNode(grpc::ServerContext* context, NodeStream* stream) override;

  absl::StatusOr<std::vector<std::shared_ptr<Node>>> WaitForNodes(int count,
                                                                  absl::Duration timeout);
  absl::StatusOr<std::vector<std::unique_ptr<Process>>> Launch(const NodeLaunch& launch,
                                                               ExitCallback on_exit,
                                                               LossCallback on_lost);

  void Signal(Node& node, const RemoteWorker& worker, int signal);
  std::optional<ExitStatus> WaitFor(const RemoteWorker& worker, absl::Duration timeout);

  const std::string& address() const { return address_; }
  const std::string& host() const { return host_; }

 private:
  void Handle(const std::shared_ptr<Node>& node, const v1::NodeToController& message);
  void OnLaunched(Node& node, const v1::WorkersLaunched& reply);
  void OnExited(Node& node, const v1::WorkerExited& exited);
  // LoseNode ends `node`: its workers count as lost and their owners hear
  // `cause`.
  void LoseNode(const std::shared_ptr<Node>& node, const std::string& cause);
  // PingNodes pings every node and loses those silent for node_timeout.
  void PingNodes();
  // SendLaunch asks `node` to start `ranks`; AwaitLaunch waits for its answer
  // and adds the started processes to `processes`.
  absl::StatusOr<int64_t> SendLaunch(Node& node, const std::vector<int>& ranks,
                                     const NodeLaunch& launch, const std::string& master_addr,
                                     int master_port, ExitCallback on_exit, LossCallback on_lost);
  absl::StatusOr<v1::WorkersLaunched> AwaitLaunch(const std::shared_ptr<Node>& node,
                                                  int64_t launch_id,
                                                  std::vector<std::unique_ptr<Process>>* processes);

  class RemoteProcess;

  const NodePoolOptions options_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::string host_;
  std::thread pinger_;

  absl::Mutex mu_;
  std::map<int64_t, std::shared_ptr<Node>> nodes_ ABSL_GUARDED_BY(mu_);  // attached, not lost
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
};

// RemoteProcess: a worker process on a node, through its agent.
class NodePool::Impl::RemoteProcess final : public Process {
 public:
  RemoteProcess(NodePool::Impl* pool, std::shared_ptr<Node> node,
                std::shared_ptr<RemoteWorker> worker)
      : pool_(pool), node_(std::move(node)), worker_(std::move(worker)) {}
  ~RemoteProcess() override {
    {
      absl::MutexLock lock(&worker_->callback_mu);
      worker_->on_exit = nullptr;
      worker_->on_lost = nullptr;
    }
    Signal(SIGKILL);
  }

  pid_t pid() const override { return worker_->pid; }
  std::string Describe() const override {
    return absl::StrCat("pid ", worker_->pid, " on ", node_->info.Describe());
  }
  void Signal(int signal) override { pool_->Signal(*node_, *worker_, signal); }
  std::optional<ExitStatus> WaitFor(absl::Duration timeout) override {
    return pool_->WaitFor(*worker_, timeout);
  }

 private:
  NodePool::Impl* const pool_;
  const std::shared_ptr<Node> node_;
  const std::shared_ptr<RemoteWorker> worker_;
};

absl::Status NodePool::Impl::Start() {
  const size_t colon = options_.listen.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the node pool's listen address '", options_.listen,
                     "' is not HOST:PORT (an address the nodes can reach)"));
  }
  const std::string host = options_.listen.substr(0, colon);
  if (host == "0.0.0.0" || host == "[::]") {
    return absl::InvalidArgumentError(
        absl::StrCat("the node pool's listen address '", options_.listen,
                     "' must name this machine's own address: nodes dial it, and workers "
                     "register there"));
  }
  // A name (`controller:29400`) is this machine's address as the nodes see
  // it; they dial the name, which TLS certificates then name too.
  DRAY_ASSIGN_OR_RETURN(const std::string bind_address, ResolveIPv4(host));
  host_ = host;
  grpc::ServerBuilder builder;
  ConfigureDrayServer(&builder);
  int port = 0;
  builder.AddListeningPort(absl::StrCat(bind_address, options_.listen.substr(colon)),
                           DrayServerCredentials(), &port);
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("the node pool cannot listen on ", options_.listen));
  }
  address_ = absl::StrCat(host_, ":", port);
  pinger_ = std::thread([this] { PingNodes(); });
  return absl::OkStatus();
}

void NodePool::Impl::Stop() {
  std::vector<std::shared_ptr<Node>> nodes;
  {
    absl::MutexLock lock(&mu_);
    if (closing_) return;
    closing_ = true;
    for (const auto& [id, node] : nodes_) nodes.push_back(node);
  }
  v1::ControllerToNode stop;
  stop.set_stop("the controller is done");
  for (const auto& node : nodes) node->Send(stop);
  if (pinger_.joinable()) pinger_.join();
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
}

grpc::Status NodePool::Impl::AttachNode(grpc::ServerContext* context, NodeStream* stream) {
  if (!CheckJobSecret(*context, options_.token).ok()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the node agent did not present this controller's cluster token");
  }
  v1::NodeToController message;
  if (!stream->Read(&message) || !message.has_hello() || message.hello().address().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a node agent's first message must be a hello naming its address");
  }
  auto node = std::make_shared<Node>();
  const v1::NodeHello& hello = message.hello();
  node->info = {hello.address(),
                hello.hostname(),
                {hello.gpus().begin(), hello.gpus().end()},
                std::max(1, hello.cores())};
  {
    absl::MutexLock lock(&node->write_mu);
    node->stream = stream;
    node->context = context;
  }
  {
    absl::MutexLock lock(&mu_);
    if (closing_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the controller is done");
    node->id = next_id_++;
    node->last_heard = absl::Now();
    nodes_[node->id] = node;
  }
  Log("controller", absl::StrCat("node ", node->info.Describe(), " attached (",
                                 node->info.gpus.size(), " GPUs, ", node->info.cores, " cores)"));
  while (stream->Read(&message)) Handle(node, message);
  LoseNode(node, "its agent's stream ended");
  {
    absl::MutexLock lock(&node->write_mu);
    node->stream = nullptr;
    node->context = nullptr;
  }
  return grpc::Status::OK;
}

void NodePool::Impl::Handle(const std::shared_ptr<Node>& node,
                            const v1::NodeToController& message) {
  {
    absl::MutexLock lock(&mu_);
    node->last_heard = absl::Now();
  }
  switch (message.kind_case()) {
    case v1::NodeToController::kLaunched:
      return OnLaunched(*node, message.launched());
    case v1::NodeToController::kExited:
      return OnExited(*node, message.exited());
    case v1::NodeToController::kOutput:
      return WriteOutput(message.output().stderr(), message.output().text());
    default:
      return;  // pings only show that the node lives
  }
}

void NodePool::Impl::OnLaunched(Node& node, const v1::WorkersLaunched& reply) {
  absl::ReleasableMutexLock lock(&mu_);
  auto pending = node.launches.find(reply.launch_id());
  if (pending == node.launches.end()) {  // its launcher gave up: nobody will use them
    lock.Release();
    v1::ControllerToNode kill;
    kill.mutable_signal()->mutable_pids()->CopyFrom(reply.pids());
    kill.mutable_signal()->set_signal(SIGKILL);
    node.Send(kill);
    return;
  }
  PendingLaunch& launch = pending->second;
  for (int i = 0; reply.error().empty() && i < reply.pids_size(); ++i) {
    // Never callback_mu under mu_: a callback may take mu_.
    auto worker = std::make_shared<RemoteWorker>(
        launch.ranks.at(i), static_cast<pid_t>(reply.pids(i)), launch.on_exit, launch.on_lost);
    node.workers[worker->pid] = worker;
    launch.workers.push_back(std::move(worker));
  }
  launch.reply = reply;
}

void NodePool::Impl::OnExited(Node& node, const v1::WorkerExited& exited) {
  std::shared_ptr<RemoteWorker> worker;
  ExitStatus status;
  status.exit_code = exited.exit_code();
  status.signal = exited.signal();
  {
    absl::MutexLock lock(&mu_);
    auto found = node.workers.find(static_cast<pid_t>(exited.pid()));
    if (found == node.workers.end()) return;
    worker = found->second;
    node.workers.erase(found);
    worker->exit = status;
  }
  absl::MutexLock callbacks(&worker->callback_mu);
  if (worker->on_exit) worker->on_exit(worker->rank, status);
}

void NodePool::Impl::LoseNode(const std::shared_ptr<Node>& node, const std::string& cause) {
  std::vector<std::shared_ptr<RemoteWorker>> lost;
  bool closing;
  {
    absl::MutexLock lock(&mu_);
    if (node->lost) return;
    node->lost = true;
    closing = closing_;
    nodes_.erase(node->id);
    for (auto& [pid, worker] : node->workers) {
      worker->exit = ExitStatus{-1, 0, /*lost=*/true};
      lost.push_back(worker);
    }
    node->workers.clear();
  }
  node->Cancel();
  if (closing) return;
  std::vector<int> ranks;
  for (const auto& worker : lost) ranks.push_back(worker->rank);
  std::sort(ranks.begin(), ranks.end());
  const std::string what = absl::StrCat("node ", node->info.Describe(), " was lost: ", cause);
  Log("controller", what);
  const absl::Status status = absl::UnavailableError(
      ranks.empty() ? what : absl::StrCat(what, "; ", RankList(ranks), " ran there"));
  for (const auto& worker : lost) {
    absl::MutexLock callbacks(&worker->callback_mu);
    if (worker->on_lost) worker->on_lost(worker->rank, status);
  }
}

void NodePool::Impl::PingNodes() {
  v1::ControllerToNode ping;
  ping.set_ping(true);
  while (true) {
    std::vector<std::shared_ptr<Node>> nodes;
    std::vector<std::pair<std::shared_ptr<Node>, absl::Duration>> silent;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&closing_), options_.heartbeat_interval)) return;
      const absl::Time now = absl::Now();
      for (const auto& [id, node] : nodes_) {
        if (now - node->last_heard > options_.node_timeout) {
          silent.emplace_back(node, now - node->last_heard);
        } else {
          nodes.push_back(node);
        }
      }
    }
    for (const auto& [node, silence] : silent) {
      LoseNode(node, absl::StrCat("it sent nothing for ", absl::FormatDuration(silence)));
    }
    for (const auto& node : nodes) node->Send(ping);
  }
}

absl::StatusOr<std::vector<std::shared_ptr<Node>>> NodePool::Impl::WaitForNodes(
    int count, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto enough = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closing_ || static_cast<int>(nodes_.size()) >= count;
  };
  mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  if (closing_) return absl::CancelledError("the node pool is shutting down");
  std::vector<std::shared_ptr<Node>> nodes;
  for (const auto& [id, node] : nodes_) nodes.push_back(node);
  std::stable_sort(nodes.begin(), nodes.end(), [](const auto& a, const auto& b) {
    return AddressBefore(a->info.address, b->info.address);
  });
  if (static_cast<int>(nodes.size()) < count) {
    std::vector<std::string> attached;
    for (const auto& node : nodes) attached.push_back(node->info.Describe());
    return absl::DeadlineExceededError(absl::StrCat(
        count - nodes.size(), " of ", count, " nodes missing after ", absl::FormatDuration(timeout),
        ": attached are [", absl::StrJoin(attached, ", "),
        "]; start `dray node --controller=", address_, "` on each node"));
  }
  nodes.resize(count);
  return nodes;
}

absl::StatusOr<int64_t> NodePool::Impl::SendLaunch(Node& node, const std::vector<int>& ranks,
                                                   const NodeLaunch& launch,
                                                   const std::string& master_addr, int master_port,
                                                   ExitCallback on_exit, LossCallback on_lost) {
  v1::ControllerToNode message;
  v1::LaunchWorkers* workers = message.mutable_launch();
  workers->set_job_secret(launch.job_secret);
  workers->set_master_port(master_port);
  for (int rank : ranks) {
    v1::WorkerLaunch* worker = workers->add_workers();
    worker->set_rank(rank);
    worker->set_local_rank(rank % launch.workers_per_node);
    worker->set_gpu(launch.first_gpu + rank % launch.workers_per_node);
    *worker->mutable_args() = {launch.args.begin(), launch.args.end()};
    auto& env = *worker->mutable_env();
    for (const auto& [key, value] : launch.env) env[key] = value;
    env["RANK"] = absl::StrCat(rank);
    env["WORLD_SIZE"] = absl::StrCat(launch.nodes * launch.workers_per_node);
    env["LOCAL_RANK"] = absl::StrCat(rank % launch.workers_per_node);
    env["LOCAL_WORLD_SIZE"] = absl::StrCat(launch.workers_per_node);
    env["MASTER_ADDR"] = master_addr;
  }
  {
    absl::MutexLock lock(&mu_);
    if (node.lost) {
      return absl::UnavailableError(absl::StrCat("node ", node.info.Describe(), " was lost"));
    }
    workers->set_launch_id(next_id_++);
    node.launches[workers->launch_id()] = {ranks, std::move(on_exit), std::move(on_lost)};
  }
  node.Send(message);  // a broken stream loses the node, which AwaitLaunch sees
  return workers->launch_id();
}

absl::StatusOr<v1::WorkersLaunched> NodePool::Impl::AwaitLaunch(
    const std::shared_ptr<Node>& node, int64_t launch_id,
    std::vector<std::unique_ptr<Process>>* processes) {
  PendingLaunch launch;
  {
    absl::MutexLock lock(&mu_);
    PendingLaunch& pending = node->launches.at(launch_id);
    auto answered = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return pending.reply.has_value() || node->lost || closing_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&answered), options_.launch_timeout);
    launch = std::move(pending);
    node->launches.erase(launch_id);
  }
  const std::string where =
      absl::StrCat(RankList(launch.ranks), " on node ", node->info.Describe());
  if (!launch.reply.has_value()) {
    return absl::UnavailableError(absl::StrCat(
        "could not start ", where, ": ",
        node->lost
            ? "the node was lost"
            : absl::StrCat("no answer within ", absl::FormatDuration(options_.launch_timeout))));
  }
  if (!launch.reply->error().empty()) {
    return absl::UnavailableError(
        absl::StrCat("could not start ", where, ": ", launch.reply->error()));
  }
  for (auto& worker : launch.workers) {
    (*processes)[worker->rank] = std::make_unique<RemoteProcess>(this, node, worker);
  }
  return *launch.reply;
}

absl::StatusOr<std::vector<std::unique_ptr<Process>>> NodePool::Impl::Launch(
    const NodeLaunch& launch, ExitCallback on_exit, LossCallback on_lost) {
  if (launch.nodes < 1 || launch.workers_per_node < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot launch ", launch.nodes, " x ", launch.workers_per_node, " workers"));
  }
  DRAY_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Node>> nodes,
                        WaitForNodes(launch.nodes, launch.wait_for_nodes));
  for (const auto& node : nodes) {
    const int gpus = static_cast<int>(node->info.gpus.size());
    if (gpus > 0 && gpus < launch.first_gpu + launch.workers_per_node) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node ", node->info.Describe(), " has ", gpus, " GPUs for ", launch.workers_per_node,
          " workers per node",
          launch.first_gpu > 0
              ? absl::StrCat(" after the ", launch.first_gpu, " that another group uses")
              : ""));
    }
  }
  std::vector<std::unique_ptr<Process>> processes(launch.nodes * launch.workers_per_node);
  auto ranks_of = [&](int node) {
    std::vector<int> ranks;
    for (int local = 0; local < launch.workers_per_node; ++local)
      ranks.push_back(node * launch.workers_per_node + local);
    return ranks;
  };
  const std::string& master_addr = nodes[0]->info.address;
  // Rank 0's node first: its agent picks the store's port, which the others need.
  DRAY_ASSIGN_OR_RETURN(int64_t first, SendLaunch(*nodes[0], ranks_of(0), launch, master_addr,
                                                  /*master_port=*/0, on_exit, on_lost));
  DRAY_ASSIGN_OR_RETURN(v1::WorkersLaunched started, AwaitLaunch(nodes[0], first, &processes));
  std::vector<int64_t> launch_ids(nodes.size());
  for (size_t i = 1; i < nodes.size(); ++i) {
    DRAY_ASSIGN_OR_RETURN(launch_ids[i],
                          SendLaunch(*nodes[i], ranks_of(static_cast<int>(i)), launch, master_addr,
                                     started.master_port(), on_exit, on_lost));
  }
  for (size_t i = 1; i < nodes.size(); ++i) {
    DRAY_RETURN_IF_ERROR(AwaitLaunch(nodes[i], launch_ids[i], &processes).status());
  }
  return processes;
}

void NodePool::Impl::Signal(Node& node, const RemoteWorker& worker, int signal) {
  {
    absl::MutexLock lock(&mu_);
    if (worker.exit.has_value()) return;
  }
  v1::ControllerToNode message;
  message.mutable_signal()->add_pids(worker.pid);
  message.mutable_signal()->set_signal(signal);
  node.Send(message);
}

std::optional<ExitStatus> NodePool::Impl::WaitFor(const RemoteWorker& worker,
                                                  absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ended = [&worker]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return worker.exit.has_value(); };
  mu_.AwaitWithTimeout(absl::Condition(&ended), timeout);
  return worker.exit;
}

NodePool::NodePool(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

NodePool::~NodePool() = default;

absl::StatusOr<std::unique_ptr<NodePool>> NodePool::Start(NodePoolOptions options) {
  if (options.token.empty()) {
    return absl::InvalidArgumentError(
        "a node pool needs a cluster token: nodes that cannot show it may not attach");
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  DRAY_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<NodePool>(new NodePool(std::move(impl)));
}

std::string NodePool::address() const { return impl_->address(); }

std::string NodePool::host() const { return impl_->host(); }

absl::StatusOr<std::vector<NodeInfo>> NodePool::WaitForNodes(int count, absl::Duration timeout) {
  DRAY_ASSIGN_OR_RETURN(auto nodes, impl_->WaitForNodes(count, timeout));
  std::vector<NodeInfo> infos;
  for (const auto& node : nodes) infos.push_back(node->info);
  return infos;
}

absl::StatusOr<std::vector<std::unique_ptr<Process>>> NodePool::Launch(const NodeLaunch& launch,
                                                                       ExitCallback on_exit,
                                                                       LossCallback on_lost) {
  return impl_->Launch(launch, std::move(on_exit), std::move(on_lost));
}

}  // namespace dray
