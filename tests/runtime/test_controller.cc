// A controller process for tests that must observe a controller from outside:
//   test_controller print WORKER_BINARY  - 2 workers print a line each; exit
//   test_controller hold WORKER_BINARY   - 2 workers; print pids, then wait forever
//   test_controller hold-on-nodes LISTEN TOKEN_FILE
//                                        - a node pool at LISTEN (prints "pool ADDRESS"),
//                                          one worker on each of 2 nodes; print pids,
//                                          then wait forever
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include <ATen/ops/zeros.h>

#include "dispatch/data_proto.h"
#include "runtime/controller/node_pool.h"
#include "runtime/controller/worker_group.h"
#include "runtime/security/job_secret.h"

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "%s\n", status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr,
                 "usage: test_controller print|hold WORKER_BINARY | hold-on-nodes LISTEN "
                 "TOKEN_FILE\n");
    return 2;
  }
  const std::string mode = argv[1];
  dray::WorkerGroupOptions options;
  options.roles = {"test"};
  dray::ResourceSpec resources{1, 2};
  std::unique_ptr<dray::NodePool> pool;
  if (mode == "hold-on-nodes") {
    absl::StatusOr<std::string> token = dray::ReadSecretFile(argv[3]);
    if (!token.ok()) return Fail(token.status());
    absl::StatusOr<std::unique_ptr<dray::NodePool>> started =
        dray::NodePool::Start({argv[2], *token});
    if (!started.ok()) return Fail(started.status());
    pool = std::move(*started);
    std::printf("pool %s\n", pool->address().c_str());
    std::fflush(stdout);
    options.nodes = pool.get();
    resources = {2, 1};
  } else {
    options.command = {argv[2]};
  }
  auto group = dray::WorkerGroup::Create(resources, options);
  if (!group.ok()) return Fail(group.status());
  if (mode == "print") {
    auto printed = (*group)->Call("print", {});
    return printed.ok() ? 0 : 1;
  }
  // Held while the process is killed: shared-memory segments both ways (on
  // one node), mapped here and in the workers.
  const at::Tensor big = at::zeros({2, 1 << 20}, at::kFloat);
  auto held = (*group)->Call("echo", {dray::DataProto::Make({{"big", big}}).value()});
  if (!held.ok()) return Fail(held.status());
  std::printf("controller %d\n", getpid());
  for (pid_t pid : (*group)->pids()) std::printf("worker %d\n", pid);
  std::printf("ready\n");
  std::fflush(stdout);
  while (true) pause();
}
