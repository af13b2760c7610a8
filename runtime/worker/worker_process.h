// The main loop of a dray worker process: host the requested worker classes,
// serve dray.v1.WorkerService (and grpc.health.v1) on an ephemeral port,
// register with the controller, and heartbeat until told to stop.
//
// A worker process exits by itself when the controller asks (Shutdown RPC or
// a heartbeat answered keep_running=false), on SIGTERM/SIGINT, or when the
// controller has been unreachable for a few seconds: no orphans.
//
//   int main(int argc, char** argv) {
//     dray::WorkerClassRegistry classes;
//     classes.Add<EchoWorker>("echo");
//     return dray::WorkerMain(classes, argc, argv);
//   }
//
// The controller starts it as `BINARY [prefix args] --controller=HOST:PORT
// --roles=a,b`, with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR and DRAY_STORE_FILE in the environment.
#ifndef DRAY_RUNTIME_WORKER_WORKER_PROCESS_H_
#define DRAY_RUNTIME_WORKER_WORKER_PROCESS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/worker/worker.h"

namespace dray {

struct WorkerProcessOptions {
  std::string controller_address;  // host:port of the controller
  std::vector<std::string> roles;  // worker classes to host
  std::string host = "127.0.0.1";  // address to listen on and advertise
};

// ParseWorkerProcessFlags reads --controller=, --roles= and --host=; other
// arguments, or a missing --controller or --roles, are INVALID_ARGUMENT.
absl::StatusOr<WorkerProcessOptions> ParseWorkerProcessFlags(const std::vector<std::string>& args);

// RunWorkerProcess serves until the process should exit; a method may still
// be running when it returns, so the process must exit right after
// (WorkerMain does, after KeepFreedMemoryForReuse).
absl::Status RunWorkerProcess(const WorkerClassRegistry& classes,
                              const WorkerProcessOptions& options);

// WorkerMain parses argv[1..], runs the worker, and returns the exit code
// (errors are printed to stderr).
int WorkerMain(const WorkerClassRegistry& classes, int argc, char** argv);

}  // namespace dray

#endif  // DRAY_RUNTIME_WORKER_WORKER_PROCESS_H_
