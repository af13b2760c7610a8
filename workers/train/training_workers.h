// TrainingWorkers: the trainer's side of its protocol with the worker
// processes, one typed method per worker method it calls (FlowGrpoWorker's
// and RewardWorker's), so that the training loop names no method and no
// meta key. StartTrainingWorkers starts them as worker groups (the reward
// functions colocated with the model, or on workers apart); a test gives
// the trainer a fake instead (FlowGrpoTrainer::Options::start_workers), so
// the loop runs in milliseconds without processes.
//
//   DRAY_ASSIGN_OR_RETURN(std::unique_ptr<TrainingWorkers> workers,
//                         StartTrainingWorkers(config, launch));
//   DRAY_ASSIGN_OR_RETURN(DataProto rollout, workers->Rollout(rows, {}));
//
// Each method is a collective over every rank: call them from one thread.
#ifndef DRAY_WORKERS_TRAIN_TRAINING_WORKERS_H_
#define DRAY_WORKERS_TRAIN_TRAINING_WORKERS_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dispatch/data_proto.h"
#include "runtime/controller/worker_group.h"
#include "workers/train/train_config.h"

namespace dray {

// PairedKind: which paired algorithm's step PairedUpdate takes.
enum class PairedKind { kSft, kVae, kDpo };

class TrainingWorkers {
 public:
  virtual ~TrainingWorkers() = default;

  // world_size: the model's ranks (the rows of a batch divide among them).
  virtual int world_size() const = 0;

  // Rollout samples `rows` (PromptSampler::RolloutRows) with the SDE
  // sampler: the edited images and the trajectories, in row order.
  virtual absl::StatusOr<DataProto> Rollout(const DataProto& rows,
                                            const GroupProgressFn& on_progress) = 0;
  // UpdateActor takes one optimizer step on the rows' trajectories with
  // their advantages; each rank's metrics (meta).
  virtual absl::StatusOr<std::vector<DataProto>> UpdateActor(const DataProto& batch) = 0;
  // trainer.async's (the rollout group apart from the model's workers):
  // SampleApart samples `rows` there (progress to `on_progress`, on other
  // threads), returning the images and the
  // trajectories (adopt_rollout's columns); AdoptRollout hands such a
  // rollout to the model's workers as if they had sampled it;
  // SyncRolloutWeights copies the trained weights
  // to the rollout group through the folder `dir`.
  virtual absl::StatusOr<DataProto> SampleApart(const DataProto& rows,
                                                const GroupProgressFn& on_progress) = 0;
  virtual absl::Status AdoptRollout(const DataProto& batch) = 0;
  virtual absl::Status SyncRolloutWeights(const std::string& dir) = 0;
  // PairedUpdate takes SFT's, the VAE's or DPO's optimizer step on
  // PromptSampler::PairedRows; each rank's metrics.
  virtual absl::StatusOr<std::vector<DataProto>> PairedUpdate(const DataProto& batch,
                                                              PairedKind kind) = 0;
  // Dmd2Update takes DMD2's step on PromptSampler::Dmd2Rows (the
  // generator's, when they ask, and the fake score's; progress
  // "distilling", micro-batches done, to `on_progress`); each rank's metrics.
  virtual absl::StatusOr<std::vector<DataProto>> Dmd2Update(const DataProto& batch,
                                                            const GroupProgressFn& on_progress) = 0;
  // Edit edits the rows as the model now does (with `vae`, reconstructs
  // the input images): kEditedColumn in row order.
  virtual absl::StatusOr<DataProto> Edit(const DataProto& rows, bool vae) = 0;
  // ComputeReward scores the samples with config.reward_functions on the
  // reward workers: [samples, functions].
  virtual absl::StatusOr<at::Tensor> ComputeReward(const DataProto& samples) = 0;

  // Save writes the trained weights into `dir` (loadable by `dray edit`);
  // SaveCheckpoint each rank's shards of them and of AdamW's state;
  // LoadCheckpoint loads such a checkpoint.
  virtual absl::Status Save(const std::string& dir) = 0;
  virtual absl::Status SaveCheckpoint(const std::string& dir) = 0;
  virtual absl::Status LoadCheckpoint(const std::string& dir) = 0;

  // HealthAfterFailure: OK while every worker works; otherwise UNAVAILABLE
  // naming the failed rank (after waiting up to `wait` to hear of one).
  virtual absl::Status HealthAfterFailure(absl::Duration wait) = 0;
  // Restart replaces the failed workers after `cause` with new ones that
  // have loaded the model as at the start (SupervisedGroup::RestartNow),
  // and the model's workers too whichever group failed (the trainer
  // rewinds the model): at most config.max_restarts times, each after a
  // backoff; UNAVAILABLE once they are used up.
  virtual absl::Status Restart(const absl::Status& cause) = 0;
  // restarts: how many restarts have begun.
  virtual int restarts() const = 0;

  // group: the model's worker group, where there are processes behind
  // these workers (nullptr for a fake): for tests that act on them.
  virtual WorkerGroup* group() { return nullptr; }
};

// TrainingLaunch: how StartTrainingWorkers starts the processes.
struct TrainingLaunch {
  int workers = 1;  // per node
  int nodes = 1;
  NodePool* node_pool = nullptr;
  std::vector<std::string> worker_command;
  std::vector<std::pair<std::string, std::string>> env;
  absl::Duration init_timeout = absl::Minutes(30);
  absl::Duration call_timeout = absl::Hours(4);
  absl::Duration restart_backoff = absl::Seconds(1);  // before the first restart, doubling
};

// StartTrainingWorkers starts the model's workers (and the reward workers
// config.reward_placement asks for, and trainer.async's rollout group) as
// SupervisedGroups that restart when asked, and loads the model into them.
absl::StatusOr<std::unique_ptr<TrainingWorkers>> StartTrainingWorkers(const TrainConfig& config,
                                                                      const TrainingLaunch& launch);

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_TRAINING_WORKERS_H_
