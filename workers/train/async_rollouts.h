// AsyncRollouts: trainer.async's pipeline (verl-omni's separate_async): a
// rollout group of its own samples step k + 1 while the model's workers
// update step k. The rollout group's weights are synced from the trained
// ones (through save_dir/rollout_weights/) only when a rollout would
// otherwise be more than trainer.max_staleness steps old, so step k's
// rollout was sampled by the weights step k - staleness started with,
// 1 <= staleness <= max_staleness (0 when sampled at once: the run's first
// step, or the first after a restart). The model's workers adopt each
// rollout: their update takes its own log-probs before its first step as
// the old policy's and weighs each sample by old / behaviour (update_actor).
//
//   DRAY_ASSIGN_OR_RETURN(DataProto rollout, rollouts.Take(step, rows, context, metrics));
//   DRAY_RETURN_IF_ERROR(rollouts.Ahead(step + 1, context, metrics));  // then update step
//
// Thread-safety: call from one thread; the sampling ahead runs on its own.
#ifndef DRAY_WORKERS_TRAIN_ASYNC_ROLLOUTS_H_
#define DRAY_WORKERS_TRAIN_ASYNC_ROLLOUTS_H_

#include <cstdint>
#include <future>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "dispatch/data_proto.h"
#include "workers/train/train_config.h"
#include "workers/train/training_algorithm.h"

namespace dray {

class AsyncRollouts {
 public:
  explicit AsyncRollouts(const TrainConfig& config);
  ~AsyncRollouts();  // waits for a rollout in flight

  // Take: step `step`'s rollout of `rows` (sampled ahead, or now when it
  // was not), adopted by the model's workers; adds its staleness to
  // `metrics`.
  absl::StatusOr<DataProto> Take(int64_t step, const DataProto& rows, const StepContext& context,
                                 Metrics& metrics);

  // Ahead starts sampling step `step`'s rows on the rollout group, after
  // syncing its weights when they would be too old ("weights_synced": 1 in
  // `metrics`). Call it between Take and the update of step `step` - 1.
  absl::Status Ahead(int64_t step, const StepContext& context, Metrics& metrics);

 private:
  // Sync gives the rollout group the trained weights step `step` starts with.
  absl::Status Sync(int64_t step, const StepContext& context, Metrics& metrics);

  struct InFlight {
    int64_t step;
    int64_t weights_step;  // the step whose starting weights sample it
    std::future<absl::StatusOr<DataProto>> rollout;
  };

  TrainConfig config_;
  int64_t weights_step_ = -1;  // the rollout group's weights: step's start (-1: unknown)
  int restarts_seen_ = 0;
  std::optional<InFlight> ahead_;
};

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_ASYNC_ROLLOUTS_H_
