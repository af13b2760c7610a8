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
// `dray init-model --preset tiny` writes to a scratch folder, kept until the
// controller goes (a restart loads it again).
//
// Self-healing: the workers are a SupervisedGroup restarted in the
// background: when the group fails (a worker dies, stalls or becomes
// unreachable), the controller logs the rank and cause, answers UNAVAILABLE
// while it restarts the whole group (after a backoff that doubles each time)
// and loads the model again, then serves as before. After max_restarts
// restarts in all it gives up: Health stays UNAVAILABLE and
// WaitUntilGivenUp returns true, so that `dray serve` exits non-zero for
// its supervisor to notice.
//
// Thread-safety: thread-safe; calls are answered in the order they are made.
#ifndef DRAY_WORKERS_EDIT_IMAGE_EDIT_CONTROLLER_H_
#define DRAY_WORKERS_EDIT_IMAGE_EDIT_CONTROLLER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dispatch/data_proto.h"
#include "runtime/controller/supervised_group.h"
#include "runtime/controller/worker_group.h"
#include "workers/edit/edit_backend.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/pipeline/edit_config.h"

namespace dray {

class ImageEditController final : public EditBackend {
 public:
  struct Options {
    // Worker processes per node. Without a node pool, all run on this
    // machine (nodes stays 1); with one (controller/node_pool.h, which must
    // outlive this), nodes x workers ranks run on the pool's nodes.
    int workers = 1;
    int nodes = 1;
    NodePool* node_pool = nullptr;
    // The worker executable and its leading arguments (`dray worker`).
    std::vector<std::string> worker_command;
    // Extra environment variables for the workers.
    std::vector<std::pair<std::string, std::string>> env;
    absl::Duration init_timeout = absl::Minutes(30);
    // Restarts of a failed worker group, in all, and the wait before the
    // first (doubling for each next one, at most a minute).
    int max_restarts = 3;
    absl::Duration restart_backoff = absl::Seconds(1);
    // How long a worker may stay silent before it counts as stalled.
    absl::Duration stall_timeout = absl::Seconds(10);
    // How long CancelAll waits for cancelled calls to stop between steps
    // before it kills the workers.
    absl::Duration cancel_grace = absl::Milliseconds(1500);
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
  // CancelRunning asks the workers to stop every call in flight between
  // denoising steps (WorkerGroup::CancelCalls).
  void CancelRunning(const absl::Status& why) override;
  // CancelAll asks the workers to stop every call between denoising steps
  // (WorkerGroup::CancelCalls) and waits up to cancel_grace for them to; it
  // kills the workers (WorkerGroup::Abort) if they have not. It refuses
  // later calls and restarts no worker.
  void CancelAll(const absl::Status& why) override;
  const ImageEditConfig& config() const override { return config_; }
  int workers() const override {
    return static_cast<int>(options_.nodes * options_.workers / config_.RanksPerEdit());
  }
  // Health: OK while the workers serve; UNAVAILABLE naming the cause while
  // they restart, or once the controller has given up.
  absl::Status Health() const override;

  // WaitUntilGivenUp waits up to `timeout` for the controller to give up
  // (restarts exhausted); true if it has.
  bool WaitUntilGivenUp(absl::Duration timeout) const;
  int restarts() const override;
  // WorkerMemory: the current group's; unknown while it restarts.
  std::vector<RankMemory> WorkerMemory() const override;

  // init_results: what the latest init_model returned, by rank (memory
  // figures as meta).
  std::vector<DataProto> init_results() const;
  // group: the current worker group (for tests and tools; may be replaced
  // by a restart at any time).
  std::shared_ptr<WorkerGroup> group() const;

  ~ImageEditController() override;

 private:
  ImageEditController(ImageEditConfig config, Options options);

  const ImageEditConfig config_;
  const Options options_;
  PromptTokenCounter count_tokens_;  // the model's tokenizer, for admission
  qwen_image::EditPipelineKind pipeline_ = qwen_image::EditPipelineKind::kEdit;  // the model's
  std::unique_ptr<SupervisedGroup> workers_;

  mutable absl::Mutex mu_;
  int calls_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dray

#endif  // DRAY_WORKERS_EDIT_IMAGE_EDIT_CONTROLLER_H_
