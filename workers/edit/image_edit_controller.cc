#include "workers/edit/image_edit_controller.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "workers/edit/edit_batch.h"
#include "workers/edit/image_edit_worker.h"
#include "workers/models/qwen_image/model.h"

namespace dray {

ImageEditController::ImageEditController(ImageEditConfig config, std::unique_ptr<WorkerGroup> group)
    : config_(std::move(config)), group_(std::move(group)) {}

absl::StatusOr<std::unique_ptr<ImageEditController>> ImageEditController::Start(
    const ImageEditConfig& config, Options options) {
  WorkerGroupOptions group_options;
  group_options.command = std::move(options.worker_command);
  group_options.roles = {kImageEditRole};
  group_options.env = std::move(options.env);
  DRAY_ASSIGN_OR_RETURN(std::unique_ptr<WorkerGroup> group,
                        WorkerGroup::Create({1, options.workers}, group_options));
  std::unique_ptr<ImageEditController> controller(
      new ImageEditController(config, std::move(group)));

  ImageEditConfig worker_config = config;
  std::optional<ScratchDir> embedded;  // the tiny model, while the workers load it
  if (config.model_path.empty()) {
    DRAY_ASSIGN_OR_RETURN(embedded, ScratchDir::Create("dray-tiny"));
    DRAY_ASSIGN_OR_RETURN(qwen_image::ModelPreset tiny, qwen_image::PresetNamed("tiny"));
    DRAY_RETURN_IF_ERROR(qwen_image::WriteRandomQwenImageModel(embedded->path(), tiny, /*seed=*/0));
    worker_config.model_path = embedded->path();
  }
  DRAY_ASSIGN_OR_RETURN(BpeTokenizer tokenizer,
                        BpeTokenizer::FromDirectory(worker_config.model_path + "/tokenizer"));
  controller->count_tokens_ =
      CountTokensWith(std::make_shared<const BpeTokenizer>(std::move(tokenizer)));
  DRAY_ASSIGN_OR_RETURN(DataProto init,
                        DataProto::Make({}, {}, {{"config", worker_config.ToYaml()}}));
  CallOptions call;
  call.timeout = options.init_timeout;
  absl::StatusOr<std::vector<DataProto>> initialized =
      controller->group_->Call("init_model", {init}, call);
  if (!initialized.ok()) {
    return absl::Status(initialized.status().code(),
                        absl::StrCat("init_model: ", initialized.status().message()));
  }
  controller->init_results_ = *std::move(initialized);
  return controller;
}

absl::StatusOr<DataProto> ImageEditController::Edit(const DataProto& batch,
                                                    std::optional<absl::Duration> timeout,
                                                    const ProgressCallback& on_progress) {
  DRAY_RETURN_IF_ERROR(CheckRows(batch, 0));
  return EditCheckedRows(batch, timeout, on_progress);
}

absl::Status ImageEditController::CheckRows(const DataProto& batch, int64_t first_row) const {
  return CheckEditBatch(batch, config_, count_tokens_, first_row);
}

absl::StatusOr<DataProto> ImageEditController::EditCheckedRows(
    const DataProto& batch, std::optional<absl::Duration> timeout,
    const ProgressCallback& on_progress) {
  DRAY_ASSIGN_OR_RETURN(DataProto seeded, WithSeeds(batch, config_.seed));
  CallOptions call;
  call.timeout = timeout;
  // Sharded ranks gather parameters together, step by step: each needs rows.
  call.equal_shards = config_.enable_fsdp;
  if (on_progress) {
    // Rank 0 runs the most rows (DP_COMPUTE_PROTO's uneven split), or as
    // many as any (equal shards): its steps are the call's.
    call.on_progress = [on_progress](int rank, const std::string& what, int64_t done,
                                     int64_t total) {
      if (rank == 0 && what == kDenoisingProgress) on_progress(done, total);
    };
  }
  DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> edited,
                        group_->Call("edit_images_batch", {std::move(seeded)}, call));
  return std::move(edited.front());
}

}  // namespace dray
