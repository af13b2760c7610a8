#include "workers/train/algorithms.h"

#include "base/status_macros.h"
#include "workers/train/dmd2_algorithm.h"
#include "workers/train/grpo_algorithm.h"
#include "workers/train/paired_algorithm.h"

namespace dray {

absl::StatusOr<std::unique_ptr<TrainingAlgorithm>> MakeTrainingAlgorithm(
    const TrainConfig& config) {
  DRAY_RETURN_IF_ERROR(config.Validate());  // a known algorithm.name among them
  if (config.paired()) return std::make_unique<PairedAlgorithm>(config);
  if (config.dmd2()) return std::make_unique<Dmd2Algorithm>(config);
  // Rollouts scored by reward: the GRPO family, DiffusionNFT, DPO on samples.
  DRAY_ASSIGN_OR_RETURN(std::unique_ptr<GrpoAlgorithm> grpo, GrpoAlgorithm::Create(config));
  return grpo;
}

}  // namespace dray
