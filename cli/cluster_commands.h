// Many nodes from the command line: the flags with which `dray train` and
// `dray serve` run their workers on node agents instead of this machine,
// and `dray node`, the agent itself (runtime/node/node_agent.h).
//
//   # on every node (srun, a Kubernetes pod, a compose service):
//   dray node --controller=HOST:PORT --token-file=/run/secrets/dray-token
//   # on the controller's node:
//   dray train --nodes 2 --workers 4 --listen HOST:PORT --token-file=... [config]
//
// The cluster token file holds any secret string the operator makes (e.g.
// `openssl rand -hex 32`); nodes without it cannot attach.
#ifndef DRAY_CLI_CLUSTER_COMMANDS_H_
#define DRAY_CLI_CLUSTER_COMMANDS_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/controller/node_pool.h"
#include "workers/config/cluster_config.h"

namespace CLI {
class App;
}  // namespace CLI

namespace dray {

// TlsFlags: --tls-cert, --tls-key, --tls-ca and --tls-mutual, which put every
// port and channel of the process and its workers on TLS (grpc_util.h).
struct TlsFlags {
  std::string cert, key, ca;
  bool mutual = false;

  void Add(CLI::App* command);
  // Apply turns TLS on when any file is given (then all three must be).
  absl::Status Apply() const;
};

// ClusterFlags: --nodes, --listen, --token-file and the TLS flags of a
// controller command.
struct ClusterFlags {
  int nodes = 1;
  std::string listen;
  std::string token_file;
  TlsFlags tls;
  CLI::App* command = nullptr;  // where the flags were added

  // Add adds the flags to `command`.
  void Add(CLI::App* command);
  // WithConfig: these flags, where the command line left one out, taken
  // from the configuration file's cluster section.
  ClusterFlags WithConfig(const ClusterConfig& config) const;

  // StartPool applies the TLS flags and starts the node pool the flags ask
  // for: none (nullptr) without --listen, when every worker runs here.
  absl::StatusOr<std::unique_ptr<NodePool>> StartPool() const;
};

// WorkerLayout: "4 workers", or "2 nodes x 4 workers", for messages.
std::string WorkerLayout(const ClusterFlags& cluster, int workers_per_node);

// NodeCommand: `dray node`.
class NodeCommand {
 public:
  // Adds the subcommand to `app`; `self` is this executable, which workers
  // run as `self worker`.
  NodeCommand(CLI::App& app, std::string self);
  ~NodeCommand();

  // Run serves the controller when the subcommand was chosen and returns
  // its exit code (0 once the controller said stop); nullopt otherwise.
  std::optional<int> Run();

  struct Flags;  // defined in cluster_commands.cc

 private:
  std::unique_ptr<Flags> flags_;
};

}  // namespace dray

#endif  // DRAY_CLI_CLUSTER_COMMANDS_H_
