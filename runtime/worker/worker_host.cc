#include "runtime/worker/worker_host.h"

#include <cstdio>
#include <exception>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/exception_message.h"
#include "base/log.h"
#include "base/status_macros.h"

namespace dray {
namespace {

v1::ExecuteMode WireExecuteMode(ExecuteMode mode) {
  return mode == ExecuteMode::kRankZero ? v1::EXECUTE_MODE_RANK_ZERO : v1::EXECUTE_MODE_ALL;
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerHost>> WorkerHost::Create(
    const WorkerClassRegistry& classes, const std::vector<std::string>& roles, int rank) {
  if (roles.empty()) return absl::InvalidArgumentError("a worker process needs at least one role");
  std::vector<std::pair<std::string, std::unique_ptr<Worker>>> workers;
  for (const std::string& role : roles) {
    for (const auto& existing : workers) {
      if (existing.first == role) {
        return absl::InvalidArgumentError(absl::StrCat("role '", role, "' is listed twice"));
      }
    }
    DRAY_ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker, classes.Create(role));
    workers.emplace_back(role, std::move(worker));
  }
  return std::unique_ptr<WorkerHost>(new WorkerHost(std::move(workers), rank));
}

absl::StatusOr<std::pair<const std::string*, const RegisteredMethod*>> WorkerHost::Find(
    absl::string_view role, absl::string_view method) const {
  std::vector<std::string> known;
  for (const auto& [worker_role, worker] : workers_) {
    if (!role.empty() && worker_role != role) continue;
    for (const RegisteredMethod& registered : worker->methods()) {
      if (registered.name == method) return std::pair{&worker_role, &registered};
      known.push_back(absl::StrCat(worker_role, ".", registered.name));
    }
  }
  return absl::NotFoundError(absl::StrCat("rank ", rank_, " has no method '",
                                          role.empty() ? "" : absl::StrCat(role, "."), method,
                                          "'; it has: ", absl::StrJoin(known, ", ")));
}

absl::StatusOr<DataProto> WorkerHost::Execute(absl::string_view role, absl::string_view method,
                                              const DataProto& input, const CallHooks& hooks) {
  DRAY_ASSIGN_OR_RETURN(auto found, Find(role, method));
  const std::string where = absl::StrCat("rank ", rank_, ", ", *found.first, ".", method);
  absl::MutexLock lock(&execute_mu_);
  // This call's hooks lead to its caller, and no later call's do.
  struct HooksScope {
    const std::vector<std::pair<std::string, std::unique_ptr<Worker>>>& workers;
    ~HooksScope() {
      for (const auto& [role, worker] : workers) worker->set_call_hooks({});
    }
  } scope{workers_};
  for (const auto& [role, worker] : workers_) worker->set_call_hooks(hooks);
  if (absl::Status stop = hooks.stop ? hooks.stop() : absl::OkStatus();
      !stop.ok() && !found.second->options.collective) {
    return absl::Status(stop.code(), absl::StrCat(where, ": not started: ", stop.message()));
  }
  try {
    absl::StatusOr<DataProto> result = found.second->fn(input);
    if (!result.ok()) {
      return absl::Status(result.status().code(),
                          absl::StrCat(where, ": ", result.status().message()));
    }
    return result;
  } catch (const std::exception& e) {
    // The caller gets the message; the full text (LibTorch's backtrace, with
    // addresses and build paths) stays in this worker's log under an id.
    const int64_t error_id = ++errors_;
    Log(absl::StrCat("worker rank ", rank_),
        absl::StrCat("error ", error_id, ": ", where, " threw: ", e.what()));
    return absl::InternalError(absl::StrCat(where, " threw: ", ExceptionMessage(e), " (error ",
                                            error_id, " in rank ", rank_, "'s log)"));
  } catch (...) {
    return absl::InternalError(absl::StrCat(where, " threw a non-standard exception"));
  }
}

v1::MethodTable WorkerHost::Describe() const {
  v1::MethodTable table;
  table.set_rank(rank_);
  for (const auto& [role, worker] : workers_) {
    for (const RegisteredMethod& method : worker->methods()) {
      v1::MethodInfo* info = table.add_methods();
      info->set_role(role);
      info->set_name(method.name);
      info->set_dispatch_mode(method.options.dispatch_mode);
      info->set_execute_mode(WireExecuteMode(method.options.execute_mode));
      info->set_blocking(method.options.blocking);
      info->set_rows_independent(method.options.rows_independent);
    }
  }
  return table;
}

}  // namespace dray
