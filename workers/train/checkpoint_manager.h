// CheckpointManager: a training run's checkpoints, the folders
// TRAINER.save_dir/checkpoints/step_N/ (N steps done), and the policy over
// them (torchtitan's checkpoint manager):
//
//   - a checkpoint is complete or absent: it is written into a hidden
//     .step_N.partial/ (the workers' shards through a callback, then
//     trainer_state.json last), made durable, and renamed into place at
//     once; partial folders left by a crash are removed at the next start;
//   - trainer.keep_last bounds how many complete ones are kept (the newest);
//   - trainer.resume says where a run starts: never (a fresh run, refused
//     where an earlier run's checkpoints would be mixed with its own), auto
//     (the newest complete one, else afresh) or a checkpoint folder; the
//     complete checkpoints after the one resumed are set aside into
//     abandoned_after_step_N/, never deleted.
//
// It knows nothing of workers or models: what a checkpoint holds beyond
// trainer_state.json is the callback's.
//
//   CheckpointManager checkpoints(config);
//   DRAY_ASSIGN_OR_RETURN(std::optional<std::string> resumed, checkpoints.ToResume());
//   DRAY_RETURN_IF_ERROR(checkpoints.Save(steps, state, [&](const std::string& dir) {
//     return workers save their shards into dir;
//   }));
//
// Thread-safety: not thread-safe; NewestComplete may be called from any
// thread (it only reads the folder).
#ifndef DRAY_WORKERS_TRAIN_CHECKPOINT_MANAGER_H_
#define DRAY_WORKERS_TRAIN_CHECKPOINT_MANAGER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "workers/train/train_config.h"

namespace dray {

// kTrainerStateFile: the file a complete checkpoint holds last.
inline constexpr char kTrainerStateFile[] = "trainer_state.json";

class CheckpointManager {
 public:
  // SaveShards writes what is not the trainer's state into folder `dir`.
  using SaveShards = std::function<absl::Status(const std::string& dir)>;

  explicit CheckpointManager(const TrainConfig& config);

  // root: TRAINER.save_dir/checkpoints.
  const std::string& root() const { return root_; }

  // Complete: the complete checkpoints, oldest first.
  std::vector<std::string> Complete() const;
  // NewestComplete: the newest complete checkpoint, or "" where there is none.
  std::string NewestComplete() const;

  // ToResume: the checkpoint trainer.resume names (nullopt: start afresh).
  // NOT_FOUND for a folder that is not a complete checkpoint;
  // FAILED_PRECONDITION for resume: never over an earlier run's checkpoints.
  absl::StatusOr<std::optional<std::string>> ToResume() const;

  // SetAsideLaterThan moves the complete checkpoints after `resumed` into
  // abandoned_after_step_N/, so that auto never mixes the two histories.
  absl::Status SetAsideLaterThan(const std::string& resumed);

  // RemovePartial removes what a save cut short left behind.
  void RemovePartial() const;

  // Save writes step_N for `steps` steps done: `save_shards`'s files and
  // `state` as trainer_state.json, complete at once; then keeps the newest
  // trainer.keep_last. A complete step_N already there (saved before a
  // restart) is kept as it is.
  absl::Status Save(int64_t steps, const nlohmann::json& state, const SaveShards& save_shards);

  // ReadState: checkpoint folder `checkpoint`'s trainer_state.json, which
  // must be an object with a "history" array (DATA_LOSS otherwise).
  static absl::StatusOr<nlohmann::json> ReadState(const std::string& checkpoint);

 private:
  std::string root_;
  std::string resume_;
  int64_t keep_last_;
};

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_CHECKPOINT_MANAGER_H_
