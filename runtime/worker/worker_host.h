// WorkerHost: the worker classes hosted by one worker process (several roles
// may be colocated, like verl's WorkerDict) and the one-at-a-time execution
// of calls into them.
//
//   DRAY_ASSIGN_OR_RETURN(auto host, WorkerHost::Create(classes, {"actor", "ref"}, rank));
//   absl::StatusOr<DataProto> out = host->Execute("actor", "compute", batch);
//
// Errors returned by a method keep their code, with the rank, role and
// method prepended; an exception becomes INTERNAL with its message only (its
// backtrace goes to the worker's log, under an error id the message names).
// Either way the host keeps serving.
//
// Thread-safety: thread-safe; Execute runs one call at a time.
#ifndef DRAY_RUNTIME_WORKER_WORKER_HOST_H_
#define DRAY_RUNTIME_WORKER_WORKER_HOST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "dispatch/data_proto.h"
#include "dray/v1/worker.pb.h"
#include "runtime/worker/worker.h"

namespace dray {

class WorkerHost {
 public:
  // Create builds one worker of each of `roles` from `classes`.
  static absl::StatusOr<std::unique_ptr<WorkerHost>> Create(const WorkerClassRegistry& classes,
                                                            const std::vector<std::string>& roles,
                                                            int rank);

  // Execute runs `method` of `role` (empty: whichever role has the method)
  // with `hooks` to its caller (progress reports, stop requests). Calls run
  // one at a time; one whose stop is requested by its turn is refused
  // ("not started"), unless its method is collective (MethodOptions).
  absl::StatusOr<DataProto> Execute(absl::string_view role, absl::string_view method,
                                    const DataProto& input, const CallHooks& hooks = {});

  // Describe returns the method table of every hosted role.
  v1::MethodTable Describe() const;

 private:
  WorkerHost(std::vector<std::pair<std::string, std::unique_ptr<Worker>>> workers, int rank)
      : workers_(std::move(workers)), rank_(rank) {}

  // Find locates a method; NOT_FOUND names what exists.
  absl::StatusOr<std::pair<const std::string*, const RegisteredMethod*>> Find(
      absl::string_view role, absl::string_view method) const;

  absl::Mutex execute_mu_;  // held for the whole of a call: actor semantics
  int64_t errors_ ABSL_GUARDED_BY(execute_mu_) = 0;  // exceptions so far, for their ids
  const std::vector<std::pair<std::string, std::unique_ptr<Worker>>> workers_;
  const int rank_;
};

}  // namespace dray

#endif  // DRAY_RUNTIME_WORKER_WORKER_HOST_H_
