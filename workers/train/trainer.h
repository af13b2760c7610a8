// FlowGrpoTrainer: the controller of a training job (verl's fit loop). It
// starts the workers (TrainingWorkers: FlowGrpoWorker processes) and runs
// total_steps steps of the algorithm algorithm.name names
// (TrainingAlgorithm: Flow-GRPO's rollout -> reward -> advantage -> update,
// or an SFT or VAE step on pairs), each step's data from a PromptSampler;
// it records every step's metrics, draws curves and samples, saves
// checkpoints (CheckpointManager), resumes, and restarts failed workers.
//
// It writes to trainer.save_dir: config.yaml (the resolved configuration),
// metrics.jsonl (a line per step), curves.png (reward and loss, redrawn
// every log_every steps), samples/step_N.png (every sample_every steps),
// checkpoints/step_N/ (every save_every steps: the trainable weights and
// AdamW's state sharded as the workers hold them, and trainer_state.json
// with the metrics so far) and final/ (the trained weights, loadable by
// `dray edit`).
//
//   DRAY_ASSIGN_OR_RETURN(auto trainer, FlowGrpoTrainer::Start(config, options));
//   DRAY_RETURN_IF_ERROR(trainer->Run());
//
// Seeds, windows, timesteps, prompts and row shuffles come from
// trainer.seed and the step alone (workers/train/prompt_sampler.h), so the
// result does not depend on the number of workers (rows_per_step must
// divide by it) beyond the order of sums, and a checkpoint's step count is
// all the random and data position a resumed run needs. A loss that is not
// finite stops the run naming the step, or with on_nan: skip skips that
// step's update.
//
// Thread-safety: not thread-safe.
#ifndef DRAY_WORKERS_TRAIN_TRAINER_H_
#define DRAY_WORKERS_TRAIN_TRAINER_H_

#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/files.h"
#include "dispatch/data_proto.h"
#include "runtime/controller/worker_group.h"
#include "workers/train/checkpoint_manager.h"
#include "workers/train/plot.h"
#include "workers/train/prompt_sampler.h"
#include "workers/train/train_config.h"
#include "workers/train/train_data.h"
#include "workers/train/training_algorithm.h"
#include "workers/train/training_workers.h"

namespace dray {

class FlowGrpoTrainer {
 public:
  struct Options {
    // How the worker processes start (training_workers.h).
    TrainingLaunch launch;
    // Where progress goes: a bar redrawn in place on a terminal, else lines.
    bool progress_bar = false;
    // Receives every rank's progress within a step's rollout ("denoising",
    // step k of n), on the group's reading threads: keep it short.
    GroupProgressFn on_rollout_progress;
    // Starts the workers (TrainingWorkers::Restart replaces failed ones);
    // empty: worker processes as `launch` says (StartTrainingWorkers).
    // Tests pass a fake.
    std::function<absl::StatusOr<std::unique_ptr<TrainingWorkers>>(const TrainConfig&)>
        start_workers;
  };

  // Start checks the configuration and every data row, writes the embedded
  // model or task when the configuration asks for them, starts the workers
  // and loads the model into them.
  static absl::StatusOr<std::unique_ptr<FlowGrpoTrainer>> Start(TrainConfig config,
                                                                Options options);
  ~FlowGrpoTrainer();

  // Run trains steps [next step, total_steps) and saves final/: with
  // trainer.save_every, a checkpoint every so many steps; with
  // trainer.max_restarts, a failed worker group (a dead or stalled worker)
  // is restarted and the run goes on from the last checkpoint (or the
  // start), as many times.
  absl::Status Run();

  // RequestStop asks Run to stop after the step under way: it saves a
  // checkpoint (with trainer.save_every) and returns CANCELLED naming it and
  // how to continue. Thread-safe: a thread waiting for signals calls it.
  void RequestStop() { stop_requested_ = true; }
  // NewestCheckpoint: the newest complete checkpoint in trainer.save_dir
  // (none: empty). Thread-safe.
  std::string NewestCheckpoint() const;

  // Step runs one training step and returns its metrics (metrics.jsonl's keys).
  absl::StatusOr<Metrics> Step(int64_t step);

  // RolloutBatch: the rows step `step` samples (its prompts, group_size
  // times each, with their seeds and SDE window).
  absl::StatusOr<DataProto> RolloutBatch(int64_t step) const;
  // PairedBatch: SFT's or the VAE's step `step`: its rows (prompts with
  // their targets, seeds and SFT's noise-level draws) and learning rate.
  absl::StatusOr<DataProto> PairedBatch(int64_t step) const;

  const TrainConfig& config() const { return config_; }
  // group: the workers' processes (a trainer with real workers only: tests
  // act on them).
  WorkerGroup& group() { return *workers_->group(); }
  // restarts: how many times Run has restarted a failed worker group.
  int restarts() const { return workers_->restarts(); }

 private:
  FlowGrpoTrainer(TrainConfig config, Options options);

  double LearningRate(int64_t step) const;
  // StartWorkers starts the workers and loads the model.
  absl::Status StartWorkers();
  // Restore loads a checkpoint into the workers and the metrics so far.
  absl::Status Restore(const std::string& checkpoint);
  // SaveCheckpoint saves the workers' shards and the metrics so far as
  // checkpoints/step_N, N steps done (checkpoints_ says how).
  absl::Status SaveCheckpoint();
  // RestoreAfterRestart brings restarted workers and the metrics back to
  // the newest checkpoint (none: to the start).
  absl::Status RestoreAfterRestart();
  // Stopped ends a run stopped on request: a checkpoint, and the error saying so.
  absl::Status Stopped();
  void ReportProgress(const std::map<std::string, double>& metrics, int64_t first,
                      absl::Time started) const;
  // WriteMetrics appends to metrics.jsonl and redraws curves.png (every log_every steps).
  absl::Status WriteMetrics(int64_t step, const std::map<std::string, double>& metrics);
  absl::Status SaveFinal();

  TrainConfig config_;
  Options options_;
  std::optional<ScratchDir> scratch_;     // the embedded model and task
  std::string model_path_;                // what the workers load
  std::optional<PromptSampler> sampler_;  // what each step works on
  CheckpointManager checkpoints_;
  std::unique_ptr<TrainingWorkers> workers_;
  // algorithm.name's step; destroyed first (trainer.async's sampling ahead
  // calls the workers until then).
  std::unique_ptr<TrainingAlgorithm> algorithm_;
  std::vector<std::map<std::string, double>> history_;  // every step's metrics
  std::atomic<bool> stop_requested_{false};
};

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_TRAINER_H_
