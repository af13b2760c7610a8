// FakeTrainingWorkers: TrainingWorkers without processes or a model, for
// unit tests of the training loop. Rollout "edits" each row into its input
// image (a trajectory would stay on the workers); updates
// answer fixed metrics; the save methods write a marker file that
// LoadCheckpoint looks for (Save also the folders of the components a real
// save fills); Restart heals them, trainer.max_restarts times. Every call
// is recorded in the shared FakeTrainingWorkers::State, and the state can
// make a call fail.
//
//   auto state = std::make_shared<FakeTrainingWorkers::State>();
//   options.start_workers = FakeTrainingWorkers::Starter(state);
//   state->fail_update_call = 3;  // the 3rd update_actor: UNAVAILABLE, unhealthy
//
// Thread-safety: not thread-safe (the trainer calls from one thread).
#ifndef DRAY_WORKERS_TRAIN_TESTING_FAKE_TRAINING_WORKERS_H_
#define DRAY_WORKERS_TRAIN_TESTING_FAKE_TRAINING_WORKERS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "workers/train/training_workers.h"

namespace dray {

class FakeTrainingWorkers : public TrainingWorkers {
 public:
  struct State {
    int world_size = 1;
    int started = 0;                 // how many times workers were started or restarted
    std::vector<std::string> calls;  // "rollout", "update_actor", "save_checkpoint DIR", ...
    std::vector<DataProto> updates;  // every update_actor batch
    // The update_actor call (1-based, over the whole run) that fails with
    // `update_failure`; after an UNAVAILABLE one the workers stay unhealthy
    // until restarted. 0: none fails.
    int fail_update_call = 0;
    absl::Status update_failure = absl::UnavailableError("rank 0 died");
  };

  // Starter: a start_workers for FlowGrpoTrainer::Options over `state`.
  static std::function<absl::StatusOr<std::unique_ptr<TrainingWorkers>>(const TrainConfig&)>
  Starter(std::shared_ptr<State> state);

  // `max_restarts`: how many times Restart succeeds (trainer.max_restarts).
  FakeTrainingWorkers(std::shared_ptr<State> state, int max_restarts)
      : state_(std::move(state)), max_restarts_(max_restarts) {}

  int world_size() const override { return state_->world_size; }
  absl::StatusOr<DataProto> Rollout(const DataProto& rows,
                                    const GroupProgressFn& on_progress) override;
  absl::StatusOr<std::vector<DataProto>> UpdateActor(const DataProto& batch) override;
  // trainer.async is tested with real workers (tests/train/async_test.cc).
  absl::StatusOr<DataProto> SampleApart(const DataProto&, const GroupProgressFn&) override {
    return absl::UnimplementedError("FakeTrainingWorkers has no rollout group");
  }
  absl::Status AdoptRollout(const DataProto&) override {
    return absl::UnimplementedError("FakeTrainingWorkers has no rollout group");
  }
  absl::Status SyncRolloutWeights(const std::string&) override {
    return absl::UnimplementedError("FakeTrainingWorkers has no rollout group");
  }
  absl::StatusOr<std::vector<DataProto>> PairedUpdate(const DataProto& batch,
                                                      PairedKind kind) override;
  absl::StatusOr<std::vector<DataProto>> Dmd2Update(const DataProto& batch,
                                                    const GroupProgressFn& on_progress) override;
  absl::StatusOr<DataProto> Edit(const DataProto& rows, bool vae) override;
  absl::StatusOr<at::Tensor> ComputeReward(const DataProto& samples) override;
  absl::Status Save(const std::string& dir) override;
  absl::Status SaveCheckpoint(const std::string& dir) override;
  absl::Status LoadCheckpoint(const std::string& dir) override;
  absl::Status HealthAfterFailure(absl::Duration wait) override { return health_; }
  absl::Status Restart(const absl::Status& cause) override;
  int restarts() const override { return restarts_; }

 private:
  // Answers: `world_size` rank results with `metrics` in meta.
  std::vector<DataProto> RankMetrics(const std::vector<const char*>& metrics) const;

  std::shared_ptr<State> state_;
  const int max_restarts_;
  int restarts_ = 0;
  absl::Status health_;
};

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_TESTING_FAKE_TRAINING_WORKERS_H_
