#include "runtime/controller/supervised_group.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status_macros.h"

namespace dray {
namespace {

constexpr absl::Duration kMaxRestartBackoff = absl::Minutes(1);

absl::Status Restarting(const absl::Status& cause) {
  return absl::UnavailableError(
      absl::StrCat("the workers are restarting after: ", cause.message()));
}

}  // namespace

GroupInitializer InitModel(std::string config_yaml, absl::Duration timeout) {
  return [config_yaml = std::move(config_yaml),
          timeout](WorkerGroup& group) -> absl::StatusOr<std::vector<DataProto>> {
    DRAY_ASSIGN_OR_RETURN(DataProto init, DataProto::Make({}, {}, {{"config", config_yaml}}));
    CallOptions call;
    call.timeout = timeout;
    absl::StatusOr<std::vector<DataProto>> initialized = group.Call("init_model", {init}, call);
    if (!initialized.ok()) {
      return absl::Status(initialized.status().code(),
                          absl::StrCat("init_model: ", initialized.status().message()));
    }
    return initialized;
  };
}

SupervisedGroup::SupervisedGroup(Options options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<SupervisedGroup>> SupervisedGroup::Start(Options options) {
  std::unique_ptr<SupervisedGroup> supervised(new SupervisedGroup(std::move(options)));
  DRAY_RETURN_IF_ERROR(supervised->StartGroup());
  if (supervised->options_.restart == Restart::kInBackground)
    supervised->supervisor_ = std::thread([raw = supervised.get()] { raw->Supervise(); });
  return supervised;
}

SupervisedGroup::~SupervisedGroup() {
  std::shared_ptr<WorkerGroup> group;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    group = std::move(group_);
  }
  if (supervisor_.joinable()) supervisor_.join();
  if (group != nullptr) group->Shutdown();
}

absl::Status SupervisedGroup::StartGroup() {
  WorkerGroupOptions group_options = options_.group;
  auto started = std::make_shared<const WorkerGroup*>(nullptr);  // set once created
  group_options.on_failure = [this, started](const absl::Status& cause) {
    OnGroupFailure(*started, cause);
  };
  DRAY_ASSIGN_OR_RETURN(std::shared_ptr<WorkerGroup> group,
                        WorkerGroup::Create(options_.resources, std::move(group_options)));
  *started = group.get();
  std::vector<DataProto> initialized;
  if (options_.initialize) {
    DRAY_ASSIGN_OR_RETURN(initialized, options_.initialize(*group));
  }
  // A failure before group_ was set went unheard by OnGroupFailure.
  const absl::Status health = group->Health();
  absl::MutexLock lock(&mu_);
  group_ = std::move(group);
  init_results_ = std::move(initialized);
  unavailable_ = absl::OkStatus();
  if (!health.ok()) {
    failure_ = health;
    unavailable_ = Restarting(health);
  }
  return absl::OkStatus();
}

void SupervisedGroup::OnGroupFailure(const WorkerGroup* group, const absl::Status& cause) {
  absl::MutexLock lock(&mu_);
  if (group == nullptr || group != group_.get() || failure_.has_value() || stopping_) return;
  failure_ = cause;
  unavailable_ = Restarting(cause);
}

void SupervisedGroup::Supervise() {
  while (true) {
    absl::Status cause;
    {
      absl::MutexLock lock(&mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || failure_.has_value();
      };
      mu_.Await(absl::Condition(&woken));
      if (stopping_) return;
      cause = *failure_;
    }
    if (!RestartAfter(cause).ok()) return;
  }
}

absl::Status SupervisedGroup::RestartNow(const absl::Status& cause) {
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.has_value()) {
      failure_ = cause;
      unavailable_ = Restarting(cause);
    }
  }
  return RestartAfter(cause);
}

absl::Status SupervisedGroup::RestartAfter(absl::Status cause) {
  const std::string& who = options_.log_name;
  Log(who, absl::StrCat("the worker group failed: ", cause.message()));
  std::shared_ptr<WorkerGroup> failed;
  {
    absl::MutexLock lock(&mu_);
    failed = std::move(group_);
  }
  if (failed != nullptr) failed->Shutdown();  // reaps every process, stopped ones included
  failed.reset();
  while (true) {
    int restart;
    {
      absl::MutexLock lock(&mu_);
      if (restarts_ >= options_.max_restarts) {
        unavailable_ = absl::UnavailableError(
            absl::StrCat("the workers failed and all ", options_.max_restarts,
                         " restarts are used up; last cause: ", cause.message()));
        Log(who, std::string(unavailable_.message()));
        given_up_flag_ = true;
        given_up_.Notify();
        return unavailable_;
      }
      restart = ++restarts_;
    }
    const absl::Duration backoff = std::min(
        options_.restart_backoff * (int64_t{1} << std::min(restart - 1, 20)), kMaxRestartBackoff);
    Log(who, absl::StrCat("restart ", restart, " of ", options_.max_restarts, " in ",
                          absl::FormatDuration(backoff)));
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), backoff))
        return absl::CancelledError("the worker group was stopped while restarting");
      failure_.reset();
    }
    const absl::Status started = StartGroup();
    if (started.ok()) {
      Log(who, absl::StrCat("restart ", restart, ": the workers serve again"));
      return absl::OkStatus();
    }
    cause = started;
    Log(who, absl::StrCat("restart ", restart, " failed: ", started.message()));
  }
}

void SupervisedGroup::Stop(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  unavailable_ = why;
}

absl::StatusOr<std::shared_ptr<WorkerGroup>> SupervisedGroup::Serving() const {
  absl::MutexLock lock(&mu_);
  if (!unavailable_.ok()) return unavailable_;
  if (group_ == nullptr) return absl::UnavailableError("the workers have stopped");
  return group_;
}

absl::StatusOr<std::shared_ptr<WorkerGroup>> SupervisedGroup::AwaitServing(
    absl::Duration timeout) const {
  {
    absl::MutexLock lock(&mu_);
    auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return (unavailable_.ok() && group_ != nullptr) || given_up_flag_ || stopping_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&settled), timeout);
  }
  return Serving();
}

absl::Status SupervisedGroup::Health() const {
  DRAY_ASSIGN_OR_RETURN(std::shared_ptr<WorkerGroup> group, Serving());
  return group->Health();
}

absl::Status SupervisedGroup::HealthAfterFailure(absl::Duration wait) {
  std::shared_ptr<WorkerGroup> current = group();
  if (current == nullptr) return absl::UnavailableError("the workers have stopped");
  const absl::Status health = current->HealthAfterFailure(wait);
  if (!health.ok()) OnGroupFailure(current.get(), health);  // may come before on_failure
  return health;
}

bool SupervisedGroup::WaitUntilGivenUp(absl::Duration timeout) const {
  return given_up_.WaitForNotificationWithTimeout(timeout);
}

int SupervisedGroup::restarts() const {
  absl::MutexLock lock(&mu_);
  return restarts_;
}

std::vector<DataProto> SupervisedGroup::init_results() const {
  absl::MutexLock lock(&mu_);
  return init_results_;
}

std::shared_ptr<WorkerGroup> SupervisedGroup::group() const {
  absl::MutexLock lock(&mu_);
  return group_;
}

}  // namespace dray
