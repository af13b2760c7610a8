// A controller process for tests that must observe a controller from outside:
//   test_controller print WORKER_BINARY  - 2 workers print a line each; exit
//   test_controller hold WORKER_BINARY   - 2 workers; print pids, then wait forever
#include <unistd.h>

#include <cstdio>
#include <string>

#include "runtime/controller/worker_group.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: test_controller print|hold WORKER_BINARY\n");
    return 2;
  }
  const std::string mode = argv[1];
  dray::WorkerGroupOptions options;
  options.command = {argv[2]};
  options.roles = {"test"};
  auto group = dray::WorkerGroup::Create({1, 2}, options);
  if (!group.ok()) {
    std::fprintf(stderr, "%s\n", group.status().ToString().c_str());
    return 1;
  }
  if (mode == "print") {
    auto printed = (*group)->Call("print", {});
    return printed.ok() ? 0 : 1;
  }
  std::printf("controller %d\n", getpid());
  for (pid_t pid : (*group)->pids()) std::printf("worker %d\n", pid);
  std::printf("ready\n");
  std::fflush(stdout);
  while (true) pause();
}
