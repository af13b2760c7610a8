#include "workers/train/async_rollouts.h"

#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "workers/train/training_protocol.h"

namespace dray {

AsyncRollouts::AsyncRollouts(const TrainConfig& config) : config_(config) {}

AsyncRollouts::~AsyncRollouts() {
  if (ahead_.has_value()) ahead_->rollout.wait();
}

absl::StatusOr<DataProto> AsyncRollouts::Take(int64_t step, const DataProto& rows,
                                              const StepContext& context, Metrics& metrics) {
  if (context.workers.restarts() != restarts_seen_) {  // new workers hold the initial weights
    restarts_seen_ = context.workers.restarts();
    weights_step_ = -1;
  }
  metrics["weights_synced"] = 0;
  absl::StatusOr<DataProto> rollout;
  int64_t weights_step = step;
  if (ahead_.has_value() && ahead_->step == step) {
    rollout = ahead_->rollout.get();
    weights_step = ahead_->weights_step;
    ahead_.reset();
  } else {
    if (ahead_.has_value()) {  // another step's (the run went back to a checkpoint)
      ahead_->rollout.wait();
      ahead_.reset();
    }
    if (weights_step_ != step) DRAY_RETURN_IF_ERROR(Sync(step, context, metrics));
    rollout = context.workers.SampleApart(rows, context.on_rollout_progress);
  }
  DRAY_RETURN_IF_ERROR(rollout.status());
  metrics["staleness"] = static_cast<double>(step - weights_step);
  DRAY_ASSIGN_OR_RETURN(
      DataProto trajectory,
      rollout->Select({std::vector<std::string>{kLatentsColumn, kNextLatentsColumn, kLogProbsColumn,
                                                kTimestepsColumn},
                       std::vector<std::string>{}, std::vector<std::string>{}}));
  DRAY_ASSIGN_OR_RETURN(DataProto adopted, rows.Union(trajectory));
  DRAY_RETURN_IF_ERROR(context.workers.AdoptRollout(adopted));
  return rollout;
}

absl::Status AsyncRollouts::Ahead(int64_t step, const StepContext& context, Metrics& metrics) {
  // The trained weights now are those step `step` - 1 started with.
  if (weights_step_ < 0 || step - weights_step_ > config_.max_staleness)
    DRAY_RETURN_IF_ERROR(Sync(step - 1, context, metrics));
  DRAY_ASSIGN_OR_RETURN(DataProto rows, context.sampler.RolloutRows(step));
  TrainingWorkers* workers = &context.workers;
  ahead_ = InFlight{
      step, weights_step_,
      std::async(std::launch::async,
                 [workers, rows = std::move(rows),
                  progress = context.on_rollout_progress]() -> absl::StatusOr<DataProto> {
                   try {
                     return workers->SampleApart(rows, progress);
                   } catch (const std::exception& error) {
                     return absl::InternalError(absl::StrCat("sampling ahead: ", error.what()));
                   }
                 })};
  return absl::OkStatus();
}

absl::Status AsyncRollouts::Sync(int64_t step, const StepContext& context, Metrics& metrics) {
  // A fresh folder: an earlier run's files (another world size) must not be read.
  const std::string dir = config_.save_dir + "/rollout_weights";
  std::error_code error;
  std::filesystem::remove_all(dir, error);
  if (!error) std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", dir, " (trainer.async's weight syncs): ", error.message()));
  }
  DRAY_RETURN_IF_ERROR(context.workers.SyncRolloutWeights(dir));
  weights_step_ = step;
  metrics["weights_synced"] = 1;
  return absl::OkStatus();
}

}  // namespace dray
