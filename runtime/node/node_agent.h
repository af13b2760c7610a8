// The node agent (`dray node`): the one dray process a cluster's engine
// starts on each node (an `srun` task, a Kubernetes pod, a compose service).
//
// It dials the controller's node pool (controller/node_pool.h), presents the
// cluster token, says who it is (address, hostname, GPUs, cores), and then
// starts the workers the controller asks for, with RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, DRAY_NODE_ADDR,
// CUDA_VISIBLE_DEVICES (the node's own GPUs, by local rank) and
// OMP_NUM_THREADS and OMP_WAIT_POLICY set, each listening on the node's address only. It
// forwards their output to the controller, prefixed "[rank R HOSTNAME] ",
// and reports how each one ended.
//
// No process outlives its job: when the controller says stop, ends the
// stream (it died) or goes silent (its network was cut), the agent kills
// its workers and returns. Workers die with the agent, too.
//
//   NodeAgentOptions options;
//   options.controller = "10.77.0.1:29400";
//   options.token = token;
//   options.worker_command = {"/usr/bin/dray", "worker"};
//   absl::Status ended = RunNodeAgent(options);  // OK once told to stop
#ifndef DRAY_RUNTIME_NODE_NODE_AGENT_H_
#define DRAY_RUNTIME_NODE_NODE_AGENT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dray {

struct NodeAgentOptions {
  std::string controller;  // host:port of the controller's node pool
  std::string token;       // the cluster token
  // This node's address, reachable from the other nodes; empty: the address
  // this machine reaches the controller from.
  std::string address;
  // The GPUs this node may use (CUDA_VISIBLE_DEVICES ids); empty: CPU only.
  std::vector<std::string> gpus;
  // How a worker starts; the controller's arguments follow.
  std::vector<std::string> worker_command;
  // How long to wait for the controller to come up.
  absl::Duration attach_timeout = absl::Seconds(60);
  absl::Duration heartbeat_interval = absl::Milliseconds(250);
  // A controller silent this long is taken for dead.
  absl::Duration controller_timeout = absl::Seconds(2);
};

// RunNodeAgent serves the controller until it says stop (OK) or is lost
// (UNAVAILABLE saying how); the workers are dead and reaped either way.
absl::Status RunNodeAgent(const NodeAgentOptions& options);

}  // namespace dray

#endif  // DRAY_RUNTIME_NODE_NODE_AGENT_H_
