// RewardWorker: the built-in reward functions (workers/train/rewards.h) in
// worker processes, verl's reward role: colocated with the model's workers
// (worker.reward.placement: colocated, the same processes host both roles)
// or in a group of its own (separate, worker.reward.num_workers processes),
// instead of in the controller (placement: controller).
//
//   compute_reward  DP_COMPUTE_PROTO  final_edited_images (the samples),
//                                     preliminary_edited_images (their inputs),
//                                     re_edit_instructions, reward_fields (a JSON
//                                     object per row), optionally reward_targets
//                                     (each row's "target" image, empty where it
//                                     names none) and meta "functions" (a JSON
//                                     list of names) in; reward_scores [B, F]
//                                     float64 out, a column per function
#ifndef DRAY_WORKERS_TRAIN_REWARD_WORKER_H_
#define DRAY_WORKERS_TRAIN_REWARD_WORKER_H_

#include "absl/status/statusor.h"
#include "dispatch/data_proto.h"
#include "runtime/worker/worker.h"

namespace dray {

inline constexpr char kRewardRole[] = "reward";
inline constexpr char kRewardFieldsColumn[] = "reward_fields";
inline constexpr char kRewardTargetsColumn[] = "reward_targets";
inline constexpr char kRewardScoresColumn[] = "reward_scores";

class RewardWorker : public Worker {
 public:
  RewardWorker();

  absl::StatusOr<DataProto> ComputeReward(const DataProto& batch);
};

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_REWARD_WORKER_H_
