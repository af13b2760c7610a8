// Worker: the base class of everything that runs in a dray worker process,
// dray's counterpart of verl's Worker with @register(dispatch_mode=...).
//
// A worker class registers its methods in its constructor, each with a
// dispatch mode (how the controller splits the input across ranks), an
// execute mode (every rank, or rank 0 only) and a blocking flag:
//
//   class EchoWorker : public dray::Worker {
//    public:
//     EchoWorker() {
//       Def("init_model", &EchoWorker::InitModel, {dray::kOneToAll});
//       Def("echo", &EchoWorker::Echo, {dray::kDpComputeProto});
//       Def("ping", &EchoWorker::Ping, {dray::kOneToAll, dray::ExecuteMode::kRankZero});
//     }
//     absl::StatusOr<dray::DataProto> InitModel(const dray::DataProto& config);
//     absl::StatusOr<dray::DataProto> Echo(const dray::DataProto& batch) { return batch; }
//     absl::StatusOr<dray::DataProto> Ping();
//   };
//
// A method takes one DataProto (or none) and returns one; scalar arguments
// travel as meta info. A method that throws, or returns an error, fails only
// that call: the worker keeps serving.
//
// Inside a method, rank(), world_size() and friends say where the worker
// stands, comm() gives the group's communicator for collectives, and
// ReportProgress tells the controller how far a long method is;
// StopRequested says when the caller wants it to stop early.
//
// Thread-safety: the runtime calls a worker's methods one at a time.
#ifndef DRAY_RUNTIME_WORKER_WORKER_H_
#define DRAY_RUNTIME_WORKER_WORKER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dispatch/data_proto.h"
#include "dispatch/dispatch_mode.h"
#include "runtime/collectives/communicator.h"

namespace dray {

// WorkerContext: where a worker stands in its group. The controller passes
// it to each worker process as RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, on one machine
// DRAY_STORE_FILE (GroupAddress::store_file), and on a node that node's own
// address, DRAY_NODE_ADDR (GroupAddress::node_addr).
struct WorkerContext {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string store_file;
  std::string node_addr;

  // FromEnvironment reads the variables above; a missing one keeps its
  // default (a lone worker), a malformed one is INVALID_ARGUMENT.
  static absl::StatusOr<WorkerContext> FromEnvironment();
};

enum class ExecuteMode {
  kAll,       // every rank runs the method
  kRankZero,  // only rank 0 runs it
};

// MethodOptions: how the controller calls a method.
struct MethodOptions {
  std::string dispatch_mode = kOneToAll;  // a name in DispatchRegistry
  ExecuteMode execute_mode = ExecuteMode::kAll;
  // Whether WorkerGroup::Invoke waits for the result (as verl's blocking).
  bool blocking = true;
  // Each output row depends on its input row alone: DP_COMPUTE_PROTO then
  // splits batches unevenly instead of padding them, and calls only the
  // ranks that get rows (see DispatchOptions).
  bool rows_independent = false;
  // Its ranks run collectives together (sharded models, the ranks of one
  // edit). The worker refuses a stopped call before it starts, unless the
  // method is collective: a rank that skipped it would leave the others
  // waiting in their first collective. A collective method decides itself,
  // e.g. with StopRequestedOnAnyRank before its first other collective.
  bool collective = false;
};

using MethodFn = std::function<absl::StatusOr<DataProto>(const DataProto& input)>;

// ProgressSink: where ReportProgress sends reports: the running call's
// Session stream, to reach the caller's CallOptions::on_progress.
using ProgressSink = std::function<void(const std::string& what, int64_t done, int64_t total)>;

// CallHooks: what ties a running method to its caller: where its progress
// goes, and `stop`, which says why the call should end now (its caller
// cancelled it, or its deadline passed) or OK to go on.
struct CallHooks {
  ProgressSink progress;
  std::function<absl::Status()> stop;
};

// RegisteredMethod: one method of a worker class.
struct RegisteredMethod {
  std::string name;
  MethodOptions options;
  MethodFn fn;
};

class Worker {
 public:
  Worker();
  virtual ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  const WorkerContext& context() const { return context_; }
  int rank() const { return context_.rank; }
  int world_size() const { return context_.world_size; }
  int local_rank() const { return context_.local_rank; }
  int local_world_size() const { return context_.local_world_size; }

  // comm returns the group's communicator for CPU tensors (Gloo), joining
  // the group on first use: every rank must reach its first comm() call.
  absl::StatusOr<Communicator*> comm();

  // device_comm returns the group's communicator for CUDA tensors (NCCL on
  // the worker's GPU), likewise joined on first use. UNIMPLEMENTED in a
  // build without CUDA.
  absl::StatusOr<Communicator*> device_comm();

  // ReportProgress tells the caller that the running method has done `done`
  // of `total` units of `what` (e.g. denoising steps). Call it from the
  // method's thread. A no-op when no caller listens (the unary Call RPC);
  // it never fails the method.
  void ReportProgress(const std::string& what, int64_t done, int64_t total) const {
    if (hooks_.progress) hooks_.progress(what, done, total);
  }

  // StopRequested says why the running method should return now: CANCELLED
  // (its caller cancelled it: GroupFuture::Cancel, a graceful shutdown) or
  // DEADLINE_EXCEEDED (no one waits for the result any more); OK to go on.
  // Long methods check it between units of work and return what it says.
  absl::Status StopRequested() const { return hooks_.stop ? hooks_.stop() : absl::OkStatus(); }

  // StopRequestedOnAnyRank is StopRequested agreed by the whole group over
  // comm(), or by the ranks of `among` (a CPU communicator of some of them),
  // a collective every one calls equally often: for methods whose ranks run
  // collectives in step, all stop together or none does.
  absl::Status StopRequestedOnAnyRank(Communicator* among = nullptr);

  void set_call_hooks(CallHooks hooks) { hooks_ = std::move(hooks); }

  const std::vector<RegisteredMethod>& methods() const { return methods_; }

 protected:
  // Def registers a method; call it from the derived class's constructor.
  template <typename T>
  void Def(std::string name, absl::StatusOr<DataProto> (T::*method)(const DataProto&),
           MethodOptions options = {}) {
    T* self = static_cast<T*>(this);
    methods_.push_back({std::move(name), std::move(options),
                        [self, method](const DataProto& input) { return (self->*method)(input); }});
  }
  template <typename T>
  void Def(std::string name, absl::StatusOr<DataProto> (T::*method)(), MethodOptions options = {}) {
    T* self = static_cast<T*>(this);
    methods_.push_back({std::move(name), std::move(options),
                        [self, method](const DataProto&) { return (self->*method)(); }});
  }

 private:
  // rendezvous joins the group's store once; both communicators use it.
  absl::StatusOr<std::shared_ptr<Rendezvous>> rendezvous();

  WorkerContext context_;
  std::vector<RegisteredMethod> methods_;
  CallHooks hooks_;
  std::shared_ptr<Rendezvous> rendezvous_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Communicator> device_comm_;
};

// WorkerClassRegistry: the worker classes a worker process can host, by role
// name. A binary that runs worker processes fills one in main():
//
//   dray::WorkerClassRegistry classes;
//   classes.Add<EchoWorker>("echo");
//   return dray::WorkerMain(classes, argc, argv);
//
// Thread-safety: fill it before starting threads; then read-only.
class WorkerClassRegistry {
 public:
  using Factory = std::function<absl::StatusOr<std::unique_ptr<Worker>>()>;

  template <typename T>
  void Add(std::string role) {
    Add(std::move(role), []() -> absl::StatusOr<std::unique_ptr<Worker>> {
      return std::unique_ptr<Worker>(new T());
    });
  }
  void Add(std::string role, Factory factory);

  // Create builds the class registered as `role`; NOT_FOUND lists the roles.
  absl::StatusOr<std::unique_ptr<Worker>> Create(absl::string_view role) const;

  std::vector<std::string> roles() const;

 private:
  std::map<std::string, Factory, std::less<>> factories_;
};

}  // namespace dray

#endif  // DRAY_RUNTIME_WORKER_WORKER_H_
