#include "workers/edit/image_edit_controller.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "workers/edit/image_edit_worker.h"
#include "workers/models/qwen_image/embedded_model.h"
#include "workers/models/qwen_image/transformer.h"
#include "workers/pipeline/edit_batch.h"

namespace dray {

ImageEditController::ImageEditController(ImageEditConfig config, Options options)
    : config_(std::move(config)), options_(std::move(options)) {}

namespace {

// CheckUlyssesHeads: whether the transformer in `model_path` has attention
// heads that config.ulysses_degree divides.
absl::Status CheckUlyssesHeads(const ImageEditConfig& config, const std::string& model_path) {
  if (config.ulysses_degree == 1) return absl::OkStatus();
  DRAY_ASSIGN_OR_RETURN(
      qwen_image::TransformerConfig transformer,
      qwen_image::TransformerConfig::FromFile(model_path + "/transformer/config.json"));
  if (transformer.num_attention_heads % config.ulysses_degree == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      kConfigSection, ".ulysses_degree ", config.ulysses_degree,
      " does not divide the transformer's ", transformer.num_attention_heads, " attention heads (",
      config.model_path.empty() ? "the embedded model" : config.model_path,
      "): --ulysses-degree must divide them"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ImageEditController>> ImageEditController::Start(
    const ImageEditConfig& config, Options options) {
  const int64_t ranks = static_cast<int64_t>(options.nodes) * options.workers;
  if (ranks % config.RanksPerEdit() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.EditLayout(), ": one edit takes ", config.RanksPerEdit(),
                     " workers, and ", ranks, " workers (", options.nodes, " node(s) x --workers ",
                     options.workers, ") are not a multiple of ", config.RanksPerEdit()));
  }
  std::unique_ptr<ImageEditController> controller(
      new ImageEditController(config, std::move(options)));
  std::string model_path = config.model_path;
  std::optional<ScratchDir> embedded;  // gone once its tokenizer is read
  if (model_path.empty()) {  // the embedded model: for its tokenizer (workers unpack their own)
    DRAY_ASSIGN_OR_RETURN(embedded, ScratchDir::Create("dray-tiny"));
    DRAY_RETURN_IF_ERROR(qwen_image::WriteEmbeddedModel(embedded->path()));
    model_path = embedded->path();
  }
  DRAY_ASSIGN_OR_RETURN(ModelFamily family, ReadModelFamily(model_path));
  DRAY_RETURN_IF_ERROR(config.CheckFamily(family));
  if (config.cfg_parallel_size > 1 &&
      (config.negative_prompt.empty() || config.true_cfg_scale <= 1)) {
    Log("edit",
        "note: cfg_parallel_size (--cfg-parallel-size) spreads guided edits only, and this "
        "configuration guides none (give a negative prompt, e.g. --negative-prompt \" \", and "
        "true_cfg_scale > 1): each of its edits runs the same pass on both workers");
  }
  DRAY_RETURN_IF_ERROR(CheckUlyssesHeads(config, model_path));  // Kontext: refused above
  DRAY_ASSIGN_OR_RETURN(controller->count_tokens_, PromptTokenCounterFor(model_path));
  DRAY_ASSIGN_OR_RETURN(controller->pipeline_, EditPipelineKindOf(config));
  const Options& launch = controller->options_;
  SupervisedGroup::Options workers;
  workers.resources = {launch.nodes, launch.workers};
  workers.group.command = launch.worker_command;
  workers.group.roles = {kImageEditRole};
  workers.group.env = launch.env;
  workers.group.stall_timeout = launch.stall_timeout;
  workers.group.nodes = launch.node_pool;
  workers.initialize = InitModel(config.ToYaml(), launch.init_timeout);
  workers.max_restarts = launch.max_restarts;
  workers.restart_backoff = launch.restart_backoff;
  DRAY_ASSIGN_OR_RETURN(controller->workers_, SupervisedGroup::Start(std::move(workers)));
  return controller;
}

ImageEditController::~ImageEditController() = default;

void ImageEditController::CancelRunning(const absl::Status& why) {
  if (std::shared_ptr<WorkerGroup> group = this->group(); group != nullptr) group->CancelCalls(why);
}

void ImageEditController::CancelAll(const absl::Status& why) {
  workers_->Stop(why);  // no restart after this
  std::shared_ptr<WorkerGroup> group = this->group();
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

absl::Status ImageEditController::Health() const { return workers_->Health(); }

bool ImageEditController::WaitUntilGivenUp(absl::Duration timeout) const {
  return workers_->WaitUntilGivenUp(timeout);
}

int ImageEditController::restarts() const { return workers_->restarts(); }

std::vector<RankMemory> ImageEditController::WorkerMemory() const {
  const std::shared_ptr<WorkerGroup> current = group();
  return current ? current->memory() : std::vector<RankMemory>();
}

std::vector<DataProto> ImageEditController::init_results() const {
  return workers_->init_results();
}

std::shared_ptr<WorkerGroup> ImageEditController::group() const { return workers_->group(); }

absl::StatusOr<DataProto> ImageEditController::Edit(const DataProto& batch,
                                                    std::optional<absl::Duration> timeout,
                                                    const ProgressCallback& on_progress) {
  DRAY_RETURN_IF_ERROR(CheckRows(batch, 0));
  return EditCheckedRows(batch, timeout, on_progress);
}

absl::Status ImageEditController::CheckRows(const DataProto& batch, int64_t first_row) const {
  return CheckEditBatch(batch, config_, pipeline_, count_tokens_, first_row);
}

absl::StatusOr<DataProto> ImageEditController::EditCheckedRows(
    const DataProto& batch, std::optional<absl::Duration> timeout,
    const ProgressCallback& on_progress) {
  DRAY_ASSIGN_OR_RETURN(DataProto seeded, WithSeeds(batch, config_.seed));
  CallOptions call;
  call.timeout = timeout;
  // Sharded ranks gather parameters together, step by step: each needs rows.
  call.equal_shards = config_.enable_fsdp;
  call.rank_group_size = static_cast<int>(config_.RanksPerEdit());
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
    absl::MutexLock lock(&mu_);  // counted at once: CancelAll waits for it
    DRAY_ASSIGN_OR_RETURN(group, workers_->Serving());
    ++calls_in_flight_;
  }
  absl::StatusOr<std::vector<DataProto>> edited =
      group->Call("edit_images_batch", {std::move(seeded)}, call);
  {
    absl::MutexLock lock(&mu_);
    --calls_in_flight_;
  }
  if (!edited.ok()) return edited.status();
  return std::move(edited->front());
}

}  // namespace dray
