// The training algorithms by name (algorithm.name), as verl-omni registers
// flow_grpo, dance_grpo and diffusion_nft: a new one is a TrainingAlgorithm
// (training_algorithm.h) in a file of its own and one line in
// MakeTrainingAlgorithm.
//
//   rollouts scored by reward (workers/train/grpo_algorithm.h): the GRPO
//          family (grpo, flow_grpo_fast, grpo_guard, mix_grpo, dance_grpo:
//          SDE rollouts, group advantages, clipped-surrogate updates),
//          diffusion_nft (ODE rollouts, DiffusionNFT's loss) and dpo on
//          its own samples
//   pairs (workers/train/paired_algorithm.h): sft, vae and dpo on data
//   distillation (workers/train/dmd2_algorithm.h): dmd2
//
//   DRAY_ASSIGN_OR_RETURN(std::unique_ptr<TrainingAlgorithm> algorithm,
//                         MakeTrainingAlgorithm(config));
#ifndef DRAY_WORKERS_TRAIN_ALGORITHMS_H_
#define DRAY_WORKERS_TRAIN_ALGORITHMS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "workers/train/train_config.h"
#include "workers/train/training_algorithm.h"

namespace dray {

// MakeTrainingAlgorithm: the algorithm algorithm.name names, ready to run
// (GRPO connects to its remote scorers first).
absl::StatusOr<std::unique_ptr<TrainingAlgorithm>> MakeTrainingAlgorithm(const TrainConfig& config);

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_ALGORITHMS_H_
