#include "workers/train/training_workers.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
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
  GroupTrainingWorkers(std::shared_ptr<WorkerGroup> model, std::shared_ptr<WorkerGroup> rewards)
      : model_(std::move(model)), rewards_(std::move(rewards)) {}

  ~GroupTrainingWorkers() override {
    for (const auto& group : {model_, rewards_}) {
      if (group != nullptr) group->Shutdown();
    }
  }

  int world_size() const override { return model_->world_size(); }

  absl::StatusOr<DataProto> Rollout(const DataProto& rows,
                                    const GroupProgressFn& on_progress) override {
    CallOptions call;
    call.on_progress = on_progress;
    DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> rolled, model_->Call("rollout", {rows}, call));
    return std::move(rolled.front());
  }

  absl::StatusOr<std::vector<DataProto>> UpdateActor(const DataProto& batch) override {
    return model_->Call("update_actor", {batch});
  }

  absl::StatusOr<std::vector<DataProto>> PairedUpdate(const DataProto& batch, bool vae) override {
    return model_->Call(vae ? "vae_update" : "sft_update", {batch});
  }

  absl::StatusOr<DataProto> Edit(const DataProto& rows, bool vae) override {
    DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> edited,
                          model_->Call(vae ? "reconstruct" : "edit", {rows}));
    return std::move(edited.front());
  }

  absl::StatusOr<at::Tensor> ComputeReward(const DataProto& samples) override {
    WorkerGroup& scorers = rewards_ != nullptr ? *rewards_ : *model_;
    DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> scored, scorers.Call("compute_reward", {samples}));
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
    return rewards_ != nullptr ? rewards_->Health() : absl::OkStatus();
  }

  WorkerGroup* group() override { return model_.get(); }

 private:
  absl::Status CallWithDir(const char* method, const std::string& dir) {
    DRAY_ASSIGN_OR_RETURN(DataProto input, DirMeta(dir));
    return model_->Call(method, {input}).status();
  }

  std::shared_ptr<WorkerGroup> model_;
  std::shared_ptr<WorkerGroup> rewards_;  // reward_placement: separate
};

}  // namespace

absl::StatusOr<std::unique_ptr<TrainingWorkers>> StartTrainingWorkers(
    const TrainConfig& config, const TrainingLaunch& launch) {
  WorkerGroupOptions options;
  options.command = launch.worker_command;
  options.roles = {kFlowGrpoRole};
  const std::string placement = config.paired() ? "controller" : config.reward_placement;
  if (placement == "colocated") options.roles.push_back(kRewardRole);
  options.env = launch.env;
  options.call_timeout = launch.call_timeout;
  options.stall_timeout = absl::Minutes(1);
  options.nodes = launch.node_pool;
  DRAY_ASSIGN_OR_RETURN(std::shared_ptr<WorkerGroup> model,
                        WorkerGroup::Create({launch.nodes, launch.workers}, options));
  std::shared_ptr<WorkerGroup> rewards;
  if (placement == "separate") {  // on the first node, on the GPUs after the model's
    options.roles = {kRewardRole};
    options.first_gpu = launch.workers;
    DRAY_ASSIGN_OR_RETURN(
        rewards, WorkerGroup::Create({1, static_cast<int>(config.reward_workers)}, options));
  }
  auto workers = std::make_unique<GroupTrainingWorkers>(model, rewards);
  DRAY_ASSIGN_OR_RETURN(DataProto init, DataProto::Make({}, {}, {{"config", config.ToYaml()}}));
  CallOptions call;
  call.timeout = launch.init_timeout;
  absl::Status initialized = model->Call("init_model", {init}, call).status();
  if (!initialized.ok()) {
    return absl::Status(initialized.code(), absl::StrCat("init_model: ", initialized.message()));
  }
  return workers;
}

}  // namespace dray
