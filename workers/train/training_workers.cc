#include "workers/train/training_workers.h"

#include "base/status_macros.h"
#include "runtime/controller/supervised_group.h"
#include "workers/train/flow_grpo_worker.h"
#include "workers/train/reward_worker.h"
#include "workers/train/training_protocol.h"

namespace dray {
namespace {

// DirMeta: a call's input naming folder `dir`.
absl::StatusOr<DataProto> DirMeta(const std::string& dir) {
  return DataProto::Make({}, {}, {{kDirKey, dir}});
}

// GroupTrainingWorkers: the workers as processes: the model's group, and
// the reward functions' own where they run apart.
class GroupTrainingWorkers : public TrainingWorkers {
 public:
  GroupTrainingWorkers(std::unique_ptr<SupervisedGroup> model,
                       std::unique_ptr<SupervisedGroup> rewards,
                       std::unique_ptr<SupervisedGroup> rollouts)
      : model_(std::move(model)), rewards_(std::move(rewards)), rollouts_(std::move(rollouts)) {}

  int world_size() const override { return model_->group()->world_size(); }

  absl::StatusOr<DataProto> Rollout(const DataProto& rows,
                                    const GroupProgressFn& on_progress) override {
    CallOptions call;
    call.on_progress = on_progress;
    DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> rolled, Call(*model_, "rollout", rows, call));
    return std::move(rolled.front());
  }

  absl::StatusOr<std::vector<DataProto>> UpdateActor(const DataProto& batch) override {
    return Call(*model_, "update_actor", batch);
  }

  absl::StatusOr<DataProto> SampleApart(const DataProto& rows,
                                        const GroupProgressFn& on_progress) override {
    if (rollouts_ == nullptr)
      return absl::FailedPreconditionError("no rollout group (trainer.async)");
    DataProto asked = rows;
    asked.SetMeta(kReturnTrajectoryKey, true);
    CallOptions call;
    call.on_progress = on_progress;
    DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> rolled, Call(*rollouts_, "rollout", asked, call));
    return std::move(rolled.front());
  }

  absl::Status AdoptRollout(const DataProto& batch) override {
    return Call(*model_, "adopt_rollout", batch).status();
  }

  absl::Status SyncRolloutWeights(const std::string& dir) override {
    if (rollouts_ == nullptr)
      return absl::FailedPreconditionError("no rollout group (trainer.async)");
    DRAY_ASSIGN_OR_RETURN(DataProto input, DirMeta(dir));
    input.SetMeta(kWeightsOnlyKey, true);
    DRAY_RETURN_IF_ERROR(Call(*model_, "save_checkpoint", input).status());
    return Call(*rollouts_, "load_checkpoint", input).status();
  }

  absl::StatusOr<std::vector<DataProto>> PairedUpdate(const DataProto& batch,
                                                      PairedKind kind) override {
    return Call(*model_,
                kind == PairedKind::kVae   ? "vae_update"
                : kind == PairedKind::kDpo ? "dpo_update"
                                           : "sft_update",
                batch);
  }

  absl::StatusOr<std::vector<DataProto>> Dmd2Update(const DataProto& batch,
                                                    const GroupProgressFn& on_progress) override {
    CallOptions call;
    call.on_progress = on_progress;
    return Call(*model_, "dmd2_update", batch, call);
  }

  absl::StatusOr<DataProto> Edit(const DataProto& rows, bool vae) override {
    DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> edited,
                          Call(*model_, vae ? "reconstruct" : "edit", rows));
    return std::move(edited.front());
  }

  absl::StatusOr<at::Tensor> ComputeReward(const DataProto& samples) override {
    SupervisedGroup& scorers = rewards_ != nullptr ? *rewards_ : *model_;
    DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> scored, Call(scorers, "compute_reward", samples));
    return scored.front().GetTensor(kRewardScoresColumn);
  }

  absl::Status Save(const std::string& dir) override { return CallWithDir("save", dir); }
  absl::Status SaveCheckpoint(const std::string& dir) override {
    return CallWithDir("save_checkpoint", dir);
  }
  absl::Status LoadCheckpoint(const std::string& dir) override {
    return CallWithDir("load_checkpoint", dir);
  }

  absl::Status HealthAfterFailure(absl::Duration wait) override {
    DRAY_RETURN_IF_ERROR(model_->HealthAfterFailure(wait));
    for (SupervisedGroup* group : {rewards_.get(), rollouts_.get()}) {
      if (group != nullptr) DRAY_RETURN_IF_ERROR(group->HealthAfterFailure(absl::ZeroDuration()));
    }
    return absl::OkStatus();
  }

  absl::Status Restart(const absl::Status& cause) override {
    // The trainer then rewinds the model to the last checkpoint, or to the
    // start when there is none, which takes fresh model workers: they
    // restart whichever group failed.
    bool restarted = false;
    for (SupervisedGroup* group : {rewards_.get(), rollouts_.get()}) {
      if (group == nullptr || group->Health().ok()) continue;
      DRAY_RETURN_IF_ERROR(group->RestartNow(cause));
      restarted = true;
    }
    if (restarted || !model_->Health().ok()) DRAY_RETURN_IF_ERROR(model_->RestartNow(cause));
    return absl::OkStatus();
  }

  int restarts() const override {
    int total = 0;
    for (const SupervisedGroup* group : {model_.get(), rewards_.get(), rollouts_.get()})
      total += group != nullptr ? group->restarts() : 0;
    return total;
  }

  WorkerGroup* group() override { return model_->group().get(); }

 private:
  static absl::StatusOr<std::vector<DataProto>> Call(const SupervisedGroup& workers,
                                                     const char* method, const DataProto& input,
                                                     const CallOptions& options = {}) {
    DRAY_ASSIGN_OR_RETURN(std::shared_ptr<WorkerGroup> group, workers.Serving());
    return group->Call(method, {input}, options);
  }

  absl::Status CallWithDir(const char* method, const std::string& dir) {
    DRAY_ASSIGN_OR_RETURN(DataProto input, DirMeta(dir));
    return Call(*model_, method, input).status();
  }

  std::unique_ptr<SupervisedGroup> model_;
  std::unique_ptr<SupervisedGroup> rewards_;   // reward_placement: separate
  std::unique_ptr<SupervisedGroup> rollouts_;  // trainer.async
};

}  // namespace

absl::StatusOr<std::unique_ptr<TrainingWorkers>> StartTrainingWorkers(
    const TrainConfig& config, const TrainingLaunch& launch) {
  SupervisedGroup::Options model;
  model.resources = {launch.nodes, launch.workers};
  model.group.command = launch.worker_command;
  model.group.roles = {kFlowGrpoRole};
  const std::string placement = config.paired() ? "controller" : config.reward_placement;
  if (placement == "colocated") model.group.roles.push_back(kRewardRole);
  model.group.env = launch.env;
  model.group.call_timeout = launch.call_timeout;
  model.group.stall_timeout = absl::Minutes(1);
  model.group.nodes = launch.node_pool;
  model.restart = SupervisedGroup::Restart::kWhenAsked;  // the trainer restores a checkpoint first
  model.max_restarts = static_cast<int>(config.max_restarts);
  model.restart_backoff = launch.restart_backoff;
  model.log_name = "train";
  model.initialize = InitModel(config.ToYaml(), launch.init_timeout);
  // trainer.async: the rollout group, the model loaded as the trained
  // workers load it, on the first node's GPUs after theirs; then
  // reward_placement separate: the reward functions' own group, on the
  // GPUs after those.
  const int rollout_workers = config.async_rollout ? static_cast<int>(config.rollout_workers) : 0;
  // Both groups on the first node's cores, each process its share.
  if (rollout_workers > 0) model.group.processes_sharing_cores = launch.workers + rollout_workers;
  SupervisedGroup::Options rollout = model;
  rollout.resources = {1, rollout_workers};
  rollout.group.roles = {kFlowGrpoRole};
  rollout.group.first_gpu = launch.workers;
  rollout.log_name = "rollout";
  rollout.group.label = "rollout";
  SupervisedGroup::Options scorers = model;
  scorers.resources = {1, static_cast<int>(config.reward_workers)};
  scorers.group.roles = {kRewardRole};
  scorers.group.first_gpu = launch.workers + rollout_workers;
  scorers.initialize = nullptr;
  DRAY_ASSIGN_OR_RETURN(std::unique_ptr<SupervisedGroup> model_workers,
                        SupervisedGroup::Start(std::move(model)));
  std::unique_ptr<SupervisedGroup> rewards, rollouts;
  if (config.async_rollout) {
    DRAY_ASSIGN_OR_RETURN(rollouts, SupervisedGroup::Start(std::move(rollout)));
  }
  if (placement == "separate") {
    DRAY_ASSIGN_OR_RETURN(rewards, SupervisedGroup::Start(std::move(scorers)));
  }
  return std::make_unique<GroupTrainingWorkers>(std::move(model_workers), std::move(rewards),
                                                std::move(rollouts));
}

}  // namespace dray
