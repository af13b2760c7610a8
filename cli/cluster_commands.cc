#include "cli/cluster_commands.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "runtime/node/node_agent.h"
#include "runtime/security/job_secret.h"
#include "runtime/security/tls.h"

namespace dray {
namespace {

// Env returns environment variable `name`, or "".
std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

// ParseGpus reads --gpus: a count ("4": GPUs 0-3) or CUDA_VISIBLE_DEVICES ids
// ("0,2,5"); empty: CUDA_VISIBLE_DEVICES as the engine set it, else none.
std::vector<std::string> ParseGpus(const std::string& flag) {
  std::vector<std::string> ids;
  if (int count = 0; absl::SimpleAtoi(flag, &count)) {
    for (int i = 0; i < count; ++i) ids.push_back(absl::StrCat(i));
    return ids;
  }
  return absl::StrSplit(flag.empty() ? Env("CUDA_VISIBLE_DEVICES") : flag, ',', absl::SkipEmpty());
}

}  // namespace

void TlsFlags::Add(CLI::App* command) {
  command->add_option("--tls-cert", cert,
                      "TLS on every port and channel: this process's certificate (PEM), whose "
                      "names or IP addresses are those peers dial");
  command->add_option("--tls-key", key, "TLS: the certificate's private key (PEM)");
  command->add_option("--tls-ca", ca,
                      "TLS: the authority (PEM) that signed every dray process's certificate");
  command->add_flag("--tls-mutual", mutual, "TLS: servers also verify their clients' certificates");
}

absl::Status TlsFlags::Apply() const {
  if (cert.empty() && key.empty() && ca.empty()) return absl::OkStatus();
  return UseTls({cert, key, ca, mutual});
}

void ClusterFlags::Add(CLI::App* command) {
  this->command = command;
  command
      ->add_option("--nodes", nodes,
                   "nodes whose agents (dray node) run the workers, --workers on each; "
                   "needs --listen")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command->add_option("--listen", listen,
                      "HOST:PORT where node agents attach (this machine's address on the "
                      "cluster network); default: workers run here");
  command->add_option("--token-file", token_file,
                      "the cluster token node agents must present (a file, e.g. a mounted "
                      "Secret); default $DRAY_TOKEN_FILE");
  tls.Add(command);
}

ClusterFlags ClusterFlags::WithConfig(const ClusterConfig& config) const {
  ClusterFlags merged = *this;
  auto unless_given = [&](const char* flag, auto& member, const auto& value) {
    if (command == nullptr || command->count(flag) == 0) member = value;
  };
  unless_given("--nodes", merged.nodes, config.nodes);
  unless_given("--listen", merged.listen, config.listen);
  unless_given("--token-file", merged.token_file, config.token_file);
  unless_given("--tls-cert", merged.tls.cert, config.tls_cert);
  unless_given("--tls-key", merged.tls.key, config.tls_key);
  unless_given("--tls-ca", merged.tls.ca, config.tls_ca);
  unless_given("--tls-mutual", merged.tls.mutual, config.tls_mutual);
  return merged;
}

absl::StatusOr<std::unique_ptr<NodePool>> ClusterFlags::StartPool() const {
  if (nodes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nodes (cluster.nodes) must be at least 1, got ", nodes));
  }
  DRAY_RETURN_IF_ERROR(tls.Apply());
  if (listen.empty()) {
    if (nodes > 1) {
      return absl::InvalidArgumentError(
          "--nodes needs --listen HOST:PORT, where the nodes' agents (dray node) attach");
    }
    return nullptr;
  }
  const std::string file = token_file.empty() ? Env("DRAY_TOKEN_FILE") : token_file;
  if (file.empty()) {
    return absl::InvalidArgumentError(
        "--listen needs --token-file (or DRAY_TOKEN_FILE): the cluster token the nodes present");
  }
  NodePoolOptions options;
  options.listen = listen;
  DRAY_ASSIGN_OR_RETURN(options.token, ReadSecretFile(file));
  DRAY_ASSIGN_OR_RETURN(std::unique_ptr<NodePool> pool, NodePool::Start(options));
  Log("controller", absl::StrCat("waiting for ", nodes, nodes == 1 ? " node" : " nodes",
                                 " to attach at ", pool->address()));
  return pool;
}

std::string WorkerLayout(const ClusterFlags& cluster, int workers_per_node) {
  const std::string workers =
      absl::StrCat(workers_per_node, " worker", workers_per_node == 1 ? "" : "s");
  if (cluster.listen.empty()) return workers;
  return absl::StrCat(cluster.nodes, " node", cluster.nodes == 1 ? "" : "s", " x ", workers);
}

struct NodeCommand::Flags {
  std::string self;
  CLI::App* node = nullptr;
  std::string controller;
  std::string token_file;
  std::string address;
  std::string gpus;
  double attach_timeout_s = 300;
  TlsFlags tls;
};

NodeCommand::NodeCommand(CLI::App& app, std::string self) : flags_(std::make_unique<Flags>()) {
  Flags& f = *flags_;
  f.self = std::move(self);
  f.node = app.add_subcommand(
      "node",
      "run a node agent: start the workers a controller (dray train/serve --listen) asks for "
      "on this node, until it ends");
  f.node->add_option("--controller", f.controller,
                     "the controller's HOST:PORT (its --listen); default $DRAY_CONTROLLER");
  f.node->add_option("--token-file", f.token_file,
                     "the cluster token (a file); default $DRAY_TOKEN_FILE");
  f.node->add_option("--address", f.address,
                     "this node's address, reachable from the others; default: the one that "
                     "routes to the controller");
  f.node->add_option("--gpus", f.gpus,
                     "GPUs for the workers: a count or ids (0,2,5); default "
                     "$CUDA_VISIBLE_DEVICES as Slurm or Kubernetes set it, else none (CPU)");
  f.node
      ->add_option("--attach-timeout-s", f.attach_timeout_s,
                   "how long to wait for the controller to come up")
      ->capture_default_str();
  f.tls.Add(f.node);
}

NodeCommand::~NodeCommand() = default;

std::optional<int> NodeCommand::Run() {
  const Flags& f = *flags_;
  if (!*f.node) return std::nullopt;
  NodeAgentOptions options;
  options.controller = f.controller.empty() ? Env("DRAY_CONTROLLER") : f.controller;
  options.address = f.address;
  options.gpus = ParseGpus(f.gpus);
  options.worker_command = {f.self, "worker"};
  options.attach_timeout = absl::Seconds(f.attach_timeout_s);
  const std::string token_file = f.token_file.empty() ? Env("DRAY_TOKEN_FILE") : f.token_file;
  absl::Status status = token_file.empty()
                            ? absl::InvalidArgumentError("needs --token-file (or DRAY_TOKEN_FILE)")
                            : f.tls.Apply();
  if (status.ok()) {
    absl::StatusOr<std::string> token = ReadSecretFile(token_file);
    status = token.status();
    if (token.ok()) {
      options.token = *token;
      status = RunNodeAgent(options);
    }
  }
  if (!status.ok()) {
    Log("node", status.ToString());
    return 1;
  }
  return 0;
}

}  // namespace dray
