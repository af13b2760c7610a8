#include "workers/train/testing/fake_training_workers.h"

#include <ATen/ATen.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/train/training_protocol.h"

namespace dray {
namespace {

constexpr char kMarker[] = "/fake_workers_saved";

// Unedited: `rows`' input images as their edits.
absl::StatusOr<DataProto> Unedited(const DataProto& rows) {
  DRAY_ASSIGN_OR_RETURN(const std::vector<Image>* images, rows.GetRows<Image>(kImagesColumn));
  DataProto out;
  DRAY_RETURN_IF_ERROR(out.AddNonTensor(kEditedColumn, *images));
  return out;
}

}  // namespace

std::function<absl::StatusOr<std::unique_ptr<TrainingWorkers>>(const TrainConfig&)>
FakeTrainingWorkers::Starter(std::shared_ptr<State> state) {
  return [state](const TrainConfig& config) -> absl::StatusOr<std::unique_ptr<TrainingWorkers>> {
    ++state->started;
    return std::make_unique<FakeTrainingWorkers>(state, static_cast<int>(config.max_restarts));
  };
}

absl::Status FakeTrainingWorkers::Restart(const absl::Status& cause) {
  state_->calls.push_back("restart");
  if (restarts_ == max_restarts_) {
    return absl::UnavailableError(absl::StrCat(
        "all ", max_restarts_, " restarts are used up; last cause: ", cause.message()));
  }
  ++restarts_;
  ++state_->started;
  health_ = absl::OkStatus();
  return absl::OkStatus();
}

absl::StatusOr<DataProto> FakeTrainingWorkers::Rollout(const DataProto& rows,
                                                       const GroupProgressFn&) {
  state_->calls.push_back("rollout");
  return Unedited(rows);
}

absl::StatusOr<std::vector<DataProto>> FakeTrainingWorkers::UpdateActor(const DataProto& batch) {
  state_->calls.push_back("update_actor");
  state_->updates.push_back(batch);
  if (static_cast<int>(state_->updates.size()) == state_->fail_update_call) {
    if (state_->update_failure.code() == absl::StatusCode::kUnavailable)
      health_ = state_->update_failure;
    return state_->update_failure;
  }
  return RankMetrics({"loss", "policy_loss", "approx_kl", "clipfrac", "grad_norm"});
}

absl::StatusOr<std::vector<DataProto>> FakeTrainingWorkers::PairedUpdate(const DataProto& batch,
                                                                         PairedKind kind) {
  switch (kind) {
    case PairedKind::kVae:
      state_->calls.push_back("vae_update");
      return RankMetrics({"loss", "reconstruction_rmse", "kl", "latent_std", "grad_norm"});
    case PairedKind::kDpo:
      state_->calls.push_back("dpo_update");
      return RankMetrics({"loss", "implicit_acc", "dpo_margin", "grad_norm"});
    case PairedKind::kSft:
      break;
  }
  state_->calls.push_back("sft_update");
  return RankMetrics({"loss", "grad_norm"});
}

absl::StatusOr<std::vector<DataProto>> FakeTrainingWorkers::Dmd2Update(
    const DataProto& batch, const GroupProgressFn& on_progress) {
  state_->calls.push_back("dmd2_update");
  return RankMetrics({"loss_fake_mean", "fake_grad_norm", "loss_dm", "grad_norm"});
}

absl::StatusOr<DataProto> FakeTrainingWorkers::Edit(const DataProto& rows, bool vae) {
  state_->calls.push_back(vae ? "reconstruct" : "edit");
  return Unedited(rows);
}

absl::StatusOr<at::Tensor> FakeTrainingWorkers::ComputeReward(const DataProto& samples) {
  state_->calls.push_back("compute_reward");
  return at::zeros({samples.size(), 1}, at::kDouble);
}

absl::Status FakeTrainingWorkers::Save(const std::string& dir) {
  state_->calls.push_back("save " + dir);
  std::error_code error;  // the folders a trained component's weights go in, as a real save's
  for (const char* component : {"transformer", "vae"})
    std::filesystem::create_directories(dir + "/" + component, error);
  return WriteFile(dir + kMarker, "");
}

absl::Status FakeTrainingWorkers::SaveCheckpoint(const std::string& dir) {
  state_->calls.push_back("save_checkpoint");
  return WriteFile(dir + kMarker, "");
}

absl::Status FakeTrainingWorkers::LoadCheckpoint(const std::string& dir) {
  state_->calls.push_back("load_checkpoint " + dir);
  DRAY_RETURN_IF_ERROR(ReadFile(dir + kMarker).status());
  return absl::OkStatus();
}

std::vector<DataProto> FakeTrainingWorkers::RankMetrics(
    const std::vector<const char*>& metrics) const {
  std::vector<DataProto> ranks(state_->world_size);
  for (DataProto& rank : ranks) {
    for (const char* name : metrics) rank.SetMeta(name, 0.25);
  }
  return ranks;
}

}  // namespace dray
