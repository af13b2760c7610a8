// ImageEditController: the controller side of image editing. It starts a
// group of QwenImageEditWorker processes, initializes them with a
// configuration (ONE_TO_ALL), and edits batches (DP_COMPUTE_PROTO), checking
// every row before dispatch so that a bad row fails its call with an error
// naming it and no worker sees it.
//
//   ImageEditController::Options options;
//   options.workers = 2;
//   options.worker_command = {"/usr/bin/dray", "worker"};
//   DRAY_ASSIGN_OR_RETURN(auto controller, ImageEditController::Start(config, options));
//   DRAY_ASSIGN_OR_RETURN(DataProto batch, MakeEditBatch(pngs, instructions));
//   DRAY_ASSIGN_OR_RETURN(DataProto edited, controller->Edit(batch));  // final_edited_images
//
// With no model_path (the embedded default) Start writes the tiny model that
// `dray init-model --preset tiny` writes to a scratch folder, loads it into
// the workers, and removes the folder.
//
// Thread-safety: thread-safe; calls are answered in the order they are made.
#ifndef DRAY_WORKERS_EDIT_IMAGE_EDIT_CONTROLLER_H_
#define DRAY_WORKERS_EDIT_IMAGE_EDIT_CONTROLLER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dispatch/data_proto.h"
#include "runtime/controller/worker_group.h"
#include "workers/edit/edit_backend.h"
#include "workers/edit/edit_batch.h"
#include "workers/edit/edit_config.h"

namespace dray {

class ImageEditController final : public EditBackend {
 public:
  struct Options {
    int workers = 1;
    // The worker executable and its leading arguments (`dray worker`).
    std::vector<std::string> worker_command;
    // Extra environment variables for the workers.
    std::vector<std::pair<std::string, std::string>> env;
    absl::Duration init_timeout = absl::Minutes(30);
  };

  static absl::StatusOr<std::unique_ptr<ImageEditController>> Start(const ImageEditConfig& config,
                                                                    Options options);

  // Edit checks `batch`'s rows (CheckRows), then EditCheckedRows.
  absl::StatusOr<DataProto> Edit(const DataProto& batch,
                                 std::optional<absl::Duration> timeout = std::nullopt,
                                 const ProgressCallback& on_progress = nullptr);

  // EditCheckedRows runs edit_images_batch across the workers on rows the
  // caller has checked already (the server checks each request as it
  // arrives); returns final_edited_images in row order. Rows without a seed
  // get config().seed + their index. `timeout` unset: the group's call
  // timeout.
  absl::StatusOr<DataProto> EditCheckedRows(const DataProto& batch,
                                            std::optional<absl::Duration> timeout,
                                            const ProgressCallback& on_progress) override;

  absl::Status CheckRows(const DataProto& batch, int64_t first_row) const override;
  const ImageEditConfig& config() const override { return config_; }
  int workers() const override { return group_->world_size(); }
  absl::Status Health() const override { return group_->Health(); }
  // init_results: what init_model returned, by rank (memory figures as meta).
  const std::vector<DataProto>& init_results() const { return init_results_; }
  WorkerGroup& group() { return *group_; }

 private:
  ImageEditController(ImageEditConfig config, std::unique_ptr<WorkerGroup> group);

  const ImageEditConfig config_;
  PromptTokenCounter count_tokens_;  // the model's tokenizer, for admission
  std::unique_ptr<WorkerGroup> group_;
  std::vector<DataProto> init_results_;
};

}  // namespace dray

#endif  // DRAY_WORKERS_EDIT_IMAGE_EDIT_CONTROLLER_H_
