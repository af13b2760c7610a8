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
                       std::unique_ptr<SupervisedGroup> rewards)
      : model_(std::move(model)), rewards_(std::move(rewards)) {}

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

  absl::StatusOr<std::vector<DataProto>> PairedUpdate(const DataProto& batch,
                                                      PairedKind kind) override {
    return Call(*model_,
                kind == PairedKind::kVae   ? "vae_update"
                : kind == PairedKind::kDpo ? "dpo_update"
                                           : "sft_update",
                batch);
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
    return rewards_ != nullptr ? rewards_->HealthAfterFailure(absl::ZeroDuration())
                               : absl::OkStatus();
  }

  absl::Status Restart(const absl::Status& cause) override {
    for (SupervisedGroup* group : {model_.get(), rewards_.get()}) {
      if (group != nullptr && !group->Health().ok()) DRAY_RETURN_IF_ERROR(group->RestartNow(cause));
    }
    return absl::OkStatus();
  }

  int restarts() const override {
    return model_->restarts() + (rewards_ != nullptr ? rewards_->restarts() : 0);
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
  std::unique_ptr<SupervisedGroup> rewards_;  // reward_placement: separate
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
  // reward_placement separate: the reward functions' own group, on the
  // first node, on the GPUs after the model's.
  SupervisedGroup::Options scorers = model;
  scorers.resources = {1, static_cast<int>(config.reward_workers)};
  scorers.group.roles = {kRewardRole};
  scorers.group.first_gpu = launch.workers;
  model.initialize = InitModel(config.ToYaml(), launch.init_timeout);
  DRAY_ASSIGN_OR_RETURN(std::unique_ptr<SupervisedGroup> model_workers,
                        SupervisedGroup::Start(std::move(model)));
  std::unique_ptr<SupervisedGroup> rewards;
  if (placement == "separate") {
    DRAY_ASSIGN_OR_RETURN(rewards, SupervisedGroup::Start(std::move(scorers)));
  }
  return std::make_unique<GroupTrainingWorkers>(std::move(model_workers), std::move(rewards));
}

}  // namespace dray
