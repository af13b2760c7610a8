// NodePool: the node agents (`dray node`) attached to a controller whose
// workers run on other machines, and the worker processes it starts there.
//
// dray grows no scheduler of its own: the engine a cluster runs (Slurm,
// Kubernetes, compose) starts one agent per node, pointed at the pool's
// address, as torchrun's agents are. A WorkerGroup given the pool
// (WorkerGroupOptions::nodes) waits for its nodes and places its ranks on
// them: nodes sorted by address, rank 0 on the first, workers_per_node
// consecutive ranks on each, as verl places them. Everything else about
// the group (sessions, dispatch modes, collectives, failure) is as on one
// machine.
//
//   NodePoolOptions pool_options;
//   pool_options.listen = "10.77.0.1:29400";
//   pool_options.token = token;  // what the agents present
//   DRAY_ASSIGN_OR_RETURN(auto pool, NodePool::Start(pool_options));
//   // on each node: dray node --controller=10.77.0.1:29400 --token-file=F
//   group_options.nodes = pool.get();
//   DRAY_ASSIGN_OR_RETURN(auto group, WorkerGroup::Create({2, 4}, group_options));
//
// Failure: a node whose agent's stream ends (the agent was killed) or that
// stays silent for node_timeout (its network was cut) is lost: its
// processes end "lost with their node", and whoever started them hears the
// cause, naming the node and its ranks. A lost node's agent, if it still
// runs, kills its workers by itself once the controller has gone quiet.
// Destroying the pool tells every agent to stop, which kills its workers.
//
// Thread-safety: thread-safe. The pool must outlive every group that uses it.
#ifndef DRAY_RUNTIME_CONTROLLER_NODE_POOL_H_
#define DRAY_RUNTIME_CONTROLLER_NODE_POOL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/process/process.h"

namespace dray {

// NodeInfo: what an agent says about its node when it attaches.
struct NodeInfo {
  std::string address;  // reachable from the other nodes
  std::string hostname;
  std::vector<std::string> gpus;  // CUDA_VISIBLE_DEVICES ids; empty on CPU
  int cores = 1;

  // Describe: "node2 (10.77.0.12)", for messages.
  std::string Describe() const;
};

struct NodePoolOptions {
  // host:port the agents dial (port 0: any free one). The host must be an
  // address the nodes can reach: groups' controller services listen there too.
  std::string listen;
  // The cluster token every agent must present (never logged; see
  // rpc/job_secret.h for how it travels).
  std::string token;
  // How often both sides ping, and how long a node may stay silent before
  // it counts as lost.
  absl::Duration heartbeat_interval = absl::Milliseconds(250);
  absl::Duration node_timeout = absl::Milliseconds(1500);
  // How long an agent may take to start its workers.
  absl::Duration launch_timeout = absl::Seconds(30);
};

// NodeLaunch: the ranks of a group, laid out on the pool's nodes.
struct NodeLaunch {
  int nodes = 1;
  int workers_per_node = 1;
  // Every worker's arguments after the agent's worker command.
  std::vector<std::string> args;
  // Every worker's extra environment, on top of what the pool and the agent
  // set (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
  // MASTER_PORT, DRAY_NODE_ADDR, CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS).
  std::vector<std::pair<std::string, std::string>> env;
  // Local rank r uses the node's GPU first_gpu + r.
  int first_gpu = 0;
  // Each worker reads it on its standard input.
  std::string job_secret;
  // How long to wait for enough nodes to attach.
  absl::Duration wait_for_nodes = absl::Seconds(60);
};

class NodePool {
 public:
  // on_exit(rank, status): a worker ended. on_lost(rank, cause): a worker
  // was lost with its node. Both run on the pool's threads; keep them short.
  using ExitCallback = std::function<void(int rank, const ExitStatus& status)>;
  using LossCallback = std::function<void(int rank, const absl::Status& cause)>;

  static absl::StatusOr<std::unique_ptr<NodePool>> Start(NodePoolOptions options);
  ~NodePool();
  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;

  // address: host:port where agents attach.
  std::string address() const;
  // host: the listen address's host as given (a name stays a name, which
  // workers dial and certificates name), where groups placed on the pool
  // serve their workers.
  std::string host() const;

  // WaitForNodes returns the first `count` attached nodes by address once
  // that many are attached; DEADLINE_EXCEEDED after `timeout`, naming the
  // nodes that did attach and how many are missing.
  absl::StatusOr<std::vector<NodeInfo>> WaitForNodes(int count, absl::Duration timeout);

  // Launch starts launch.nodes x launch.workers_per_node workers and returns
  // them by rank. Rank 0's agent picks the collectives' store port on its
  // node; the other nodes start once it has. If any node cannot start its
  // ranks, the ones started are killed and the error names the node.
  absl::StatusOr<std::vector<std::unique_ptr<Process>>> Launch(const NodeLaunch& launch,
                                                               ExitCallback on_exit,
                                                               LossCallback on_lost);

 private:
  class Impl;
  explicit NodePool(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dray

#endif  // DRAY_RUNTIME_CONTROLLER_NODE_POOL_H_
