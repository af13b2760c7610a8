#include "workers/edit/image_edit_controller.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "workers/edit/image_edit_worker.h"
#include "workers/models/qwen_image/embedded_model.h"
#include "workers/pipeline/edit_batch.h"

namespace dray {

namespace {

constexpr absl::Duration kMaxRestartBackoff = absl::Minutes(1);

}  // namespace

ImageEditController::ImageEditController(ImageEditConfig config, Options options)
    : config_(std::move(config)), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<ImageEditController>> ImageEditController::Start(
    const ImageEditConfig& config, Options options) {
  std::unique_ptr<ImageEditController> controller(
      new ImageEditController(config, std::move(options)));
  std::string model_path = config.model_path;
  if (model_path.empty()) {  // the embedded model: for its tokenizer (workers unpack their own)
    DRAY_ASSIGN_OR_RETURN(controller->embedded_, ScratchDir::Create("dray-tiny"));
    DRAY_RETURN_IF_ERROR(qwen_image::WriteEmbeddedModel(controller->embedded_->path()));
    model_path = controller->embedded_->path();
  }
  controller->worker_config_yaml_ = config.ToYaml();
  DRAY_ASSIGN_OR_RETURN(BpeTokenizer tokenizer,
                        BpeTokenizer::FromDirectory(model_path + "/tokenizer"));
  controller->count_tokens_ =
      CountTokensWith(std::make_shared<const BpeTokenizer>(std::move(tokenizer)));
  DRAY_RETURN_IF_ERROR(controller->StartGroup());
  controller->supervisor_ = std::thread([raw = controller.get()] { raw->Supervise(); });
  return controller;
}

ImageEditController::~ImageEditController() {
  std::shared_ptr<WorkerGroup> group;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    group = std::move(group_);
  }
  if (supervisor_.joinable()) supervisor_.join();
  if (group != nullptr) group->Shutdown();
}

absl::Status ImageEditController::StartGroup() {
  WorkerGroupOptions group_options;
  group_options.command = options_.worker_command;
  group_options.roles = {kImageEditRole};
  group_options.env = options_.env;
  group_options.stall_timeout = options_.stall_timeout;
  group_options.nodes = options_.node_pool;
  auto failed_group = std::make_shared<const WorkerGroup*>(nullptr);  // set once created
  group_options.on_failure = [this, failed_group](const absl::Status& cause) {
    OnGroupFailure(*failed_group, cause);
  };
  DRAY_ASSIGN_OR_RETURN(std::shared_ptr<WorkerGroup> group,
                        WorkerGroup::Create({options_.nodes, options_.workers}, group_options));
  *failed_group = group.get();
  DRAY_ASSIGN_OR_RETURN(DataProto init, DataProto::Make({}, {}, {{"config", worker_config_yaml_}}));
  CallOptions call;
  call.timeout = options_.init_timeout;
  absl::StatusOr<std::vector<DataProto>> initialized = group->Call("init_model", {init}, call);
  if (!initialized.ok()) {
    return absl::Status(initialized.status().code(),
                        absl::StrCat("init_model: ", initialized.status().message()));
  }
  // A failure before group_ was set went unheard by OnGroupFailure.
  const absl::Status health = group->Health();
  absl::MutexLock lock(&mu_);
  group_ = std::move(group);
  init_results_ = *std::move(initialized);
  unavailable_ = absl::OkStatus();
  if (!health.ok()) {
    failure_ = health;
    unavailable_ = absl::UnavailableError(
        absl::StrCat("the workers are restarting after: ", health.message()));
  }
  return absl::OkStatus();
}

void ImageEditController::OnGroupFailure(const WorkerGroup* group, const absl::Status& cause) {
  absl::MutexLock lock(&mu_);
  if (group == nullptr || group != group_.get() || failure_.has_value()) return;
  failure_ = cause;
  unavailable_ =
      absl::UnavailableError(absl::StrCat("the workers are restarting after: ", cause.message()));
}

void ImageEditController::Supervise() {
  while (true) {
    absl::Status cause;
    std::shared_ptr<WorkerGroup> failed;
    {
      absl::MutexLock lock(&mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || failure_.has_value();
      };
      mu_.Await(absl::Condition(&woken));
      if (stopping_) return;
      cause = *failure_;
      failed = std::move(group_);
    }
    Log("controller", absl::StrCat("the worker group failed: ", cause.message()));
    failed->Shutdown();  // reaps every process, stopped ones included
    failed.reset();
    while (true) {
      int restart;
      {
        absl::MutexLock lock(&mu_);
        if (restarts_ >= options_.max_restarts) {
          unavailable_ = absl::UnavailableError(
              absl::StrCat("the workers failed and all ", options_.max_restarts,
                           " restarts are used up; last cause: ", cause.message()));
          Log("controller", std::string(unavailable_.message()));
          given_up_.Notify();
          return;
        }
        restart = ++restarts_;
      }
      const absl::Duration backoff = std::min(
          options_.restart_backoff * (int64_t{1} << std::min(restart - 1, 20)), kMaxRestartBackoff);
      Log("controller", absl::StrCat("restart ", restart, " of ", options_.max_restarts, " in ",
                                     absl::FormatDuration(backoff)));
      {
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), backoff)) return;
        failure_.reset();
      }
      absl::Status started = StartGroup();
      if (started.ok()) {
        Log("controller", absl::StrCat("restart ", restart, ": the workers serve again"));
        break;
      }
      cause = started;
      Log("controller", absl::StrCat("restart ", restart, " failed: ", started.message()));
    }
  }
}

void ImageEditController::CancelRunning(const absl::Status& why) {
  if (std::shared_ptr<WorkerGroup> group = this->group(); group != nullptr) group->CancelCalls(why);
}

void ImageEditController::CancelAll(const absl::Status& why) {
  std::shared_ptr<WorkerGroup> group;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;  // no restart after this
    unavailable_ = why;
    group = group_;
  }
  if (group == nullptr) return;
  group->CancelCalls(why);
  bool stopped;
  {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_in_flight_ == 0; };
    stopped = mu_.AwaitWithTimeout(absl::Condition(&idle), options_.cancel_grace);
  }
  if (!stopped) group->Abort(why);
}

absl::Status ImageEditController::Health() const {
  std::shared_ptr<WorkerGroup> group;
  {
    absl::MutexLock lock(&mu_);
    if (!unavailable_.ok()) return unavailable_;
    group = group_;
  }
  if (group == nullptr) return absl::UnavailableError("the workers have stopped");
  return group->Health();
}

bool ImageEditController::WaitUntilGivenUp(absl::Duration timeout) const {
  return given_up_.WaitForNotificationWithTimeout(timeout);
}

int ImageEditController::restarts() const {
  absl::MutexLock lock(&mu_);
  return restarts_;
}

std::vector<DataProto> ImageEditController::init_results() const {
  absl::MutexLock lock(&mu_);
  return init_results_;
}

std::shared_ptr<WorkerGroup> ImageEditController::group() const {
  absl::MutexLock lock(&mu_);
  return group_;
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
  std::shared_ptr<WorkerGroup> group;
  {
    absl::MutexLock lock(&mu_);
    if (!unavailable_.ok()) return unavailable_;
    group = group_;
    ++calls_in_flight_;
  }
  absl::StatusOr<std::vector<DataProto>> edited =
      group == nullptr ? absl::UnavailableError("the workers have stopped")
                       : group->Call("edit_images_batch", {std::move(seeded)}, call);
  {
    absl::MutexLock lock(&mu_);
    --calls_in_flight_;
  }
  if (!edited.ok()) return edited.status();
  return std::move(edited->front());
}

}  // namespace dray
