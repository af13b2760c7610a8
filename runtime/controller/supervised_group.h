// SupervisedGroup: a worker group that comes back when it fails, for the
// controllers that outlive their workers (`dray serve`'s image-edit
// controller, `dray train`'s trainer), as torchrun's elastic agent restarts
// a failed job's workers.
//
// Start launches the group (WorkerGroup::Create) and readies it
// (`initialize`: the workers' init_model). When the group fails (a worker
// dies, stalls or becomes unreachable: WorkerGroup's failures), Serving and
// Health answer UNAVAILABLE naming the cause until a new group serves; the
// failed group is shut down (every process reaped) and a new one started and
// readied. Each restart waits first, restart_backoff for the first and
// twice as long for each next (at most a minute), and after max_restarts
// restarts in all the group gives up: Health stays UNAVAILABLE saying so and
// WaitUntilGivenUp returns true.
//
// Who restarts: with restart = kInBackground a supervisor thread does, at
// once (serving: requests meanwhile get UNAVAILABLE and may retry); with
// kWhenAsked the owner calls Restart when it has noticed the failure
// (training: the trainer loads its newest checkpoint into the new group
// before the next step, so the group must not change under it).
//
//   SupervisedGroup::Options options;
//   options.resources = {1, 2};
//   options.group.command = {"/usr/bin/dray", "worker"};
//   options.group.roles = {"qwen_image_edit"};
//   options.initialize = InitModel(config_yaml, absl::Minutes(30));
//   DRAY_ASSIGN_OR_RETURN(auto workers, SupervisedGroup::Start(std::move(options)));
//   DRAY_ASSIGN_OR_RETURN(std::shared_ptr<WorkerGroup> group, workers->Serving());
//   DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> out, group->Call("edit", {batch}));
//
// Thread-safety: thread-safe.
#ifndef DRAY_RUNTIME_CONTROLLER_SUPERVISED_GROUP_H_
#define DRAY_RUNTIME_CONTROLLER_SUPERVISED_GROUP_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "dispatch/data_proto.h"
#include "runtime/controller/worker_group.h"

namespace dray {

// GroupInitializer readies a freshly started group (loads the model) and
// returns what its ranks answered; an error fails the start.
using GroupInitializer = std::function<absl::StatusOr<std::vector<DataProto>>(WorkerGroup&)>;

// InitModel: the usual GroupInitializer, verl's: `init_model` on every rank
// with meta {"config": config_yaml}, within `timeout`.
GroupInitializer InitModel(std::string config_yaml, absl::Duration timeout);

class SupervisedGroup {
 public:
  enum class Restart { kInBackground, kWhenAsked };

  struct Options {
    ResourceSpec resources;
    // How each group is launched; on_failure is the supervisor's.
    WorkerGroupOptions group;
    // Readies each group before it serves; unset: nothing to ready.
    GroupInitializer initialize;
    Restart restart = Restart::kInBackground;
    // Restarts in all, and the wait before the first (doubling for each
    // next one, at most a minute).
    int max_restarts = 3;
    absl::Duration restart_backoff = absl::Seconds(1);
    // Who speaks in the log lines about failures and restarts.
    std::string log_name = "controller";
  };

  // Start launches and readies the first group; its failure is Start's
  // (nothing is restarted before a group has served).
  static absl::StatusOr<std::unique_ptr<SupervisedGroup>> Start(Options options);
  // Stops supervising and shuts the current group down.
  ~SupervisedGroup();
  SupervisedGroup(const SupervisedGroup&) = delete;
  SupervisedGroup& operator=(const SupervisedGroup&) = delete;

  // Serving: the group while it serves; otherwise UNAVAILABLE naming why
  // (restarting after a cause, given up, or Stop's reason).
  absl::StatusOr<std::shared_ptr<WorkerGroup>> Serving() const;
  // Health: OK while the group serves and all its ranks work.
  absl::Status Health() const;
  // HealthAfterFailure: WorkerGroup::HealthAfterFailure of the current
  // group, for an owner whose call just failed; a failure it finds counts
  // as the group's (Serving answers UNAVAILABLE from then on).
  absl::Status HealthAfterFailure(absl::Duration wait);

  // RestartNow (kWhenAsked) replaces the group after `cause`: shuts it down,
  // waits the backoff, starts and readies a new one (again, within the
  // budget, if that fails). OK once a new group serves; UNAVAILABLE once
  // the restarts are used up; CANCELLED if Stop came first.
  absl::Status RestartNow(const absl::Status& cause);

  // Stop: no restart after this; Serving answers `why`. The group itself is
  // left to its owner (group(): cancel its calls, abort it).
  void Stop(const absl::Status& why);

  // AwaitServing waits up to `timeout` for the group to serve (a restart to
  // finish), for the restarts to run out, or for Stop; then answers as
  // Serving.
  absl::StatusOr<std::shared_ptr<WorkerGroup>> AwaitServing(absl::Duration timeout) const;

  // WaitUntilGivenUp waits up to `timeout` for the restarts to run out;
  // true if they have.
  bool WaitUntilGivenUp(absl::Duration timeout) const;
  // restarts: how many restarts have begun.
  int restarts() const;
  // init_results: what `initialize` returned for the current group.
  std::vector<DataProto> init_results() const;
  // group: the current group, serving or failed (nullptr while none is
  // started); a restart may replace it at any time.
  std::shared_ptr<WorkerGroup> group() const;

 private:
  explicit SupervisedGroup(Options options);

  // StartGroup launches and readies a group and makes it the current one.
  absl::Status StartGroup();
  void OnGroupFailure(const WorkerGroup* group, const absl::Status& cause);
  // Supervise (kInBackground) restarts after each failure until stopped or
  // given up.
  void Supervise();
  // RestartAfter shuts the failed group down and starts new ones until one
  // serves, the budget is used up, or Stop.
  absl::Status RestartAfter(absl::Status cause);

  const Options options_;
  std::thread supervisor_;
  absl::Notification given_up_;

  mutable absl::Mutex mu_;
  std::shared_ptr<WorkerGroup> group_ ABSL_GUARDED_BY(mu_);
  std::vector<DataProto> init_results_ ABSL_GUARDED_BY(mu_);
  absl::Status unavailable_ ABSL_GUARDED_BY(mu_);             // OK while serving
  std::optional<absl::Status> failure_ ABSL_GUARDED_BY(mu_);  // to restart after
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool given_up_flag_ ABSL_GUARDED_BY(mu_) = false;  // given_up_, for AwaitServing
  int restarts_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dray

#endif  // DRAY_RUNTIME_CONTROLLER_SUPERVISED_GROUP_H_
