#include "workers/train/algorithms.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "workers/train/grpo_algorithm.h"
#include "workers/train/paired_algorithm.h"

namespace dray {

absl::StatusOr<std::unique_ptr<TrainingAlgorithm>> MakeTrainingAlgorithm(
    const TrainConfig& config) {
  if (config.grpo() || (config.dpo() && !config.paired())) {  // rollouts scored by reward
    DRAY_ASSIGN_OR_RETURN(std::unique_ptr<GrpoAlgorithm> grpo, GrpoAlgorithm::Create(config));
    return grpo;
  }
  if (config.paired()) return std::make_unique<PairedAlgorithm>(config);
  return absl::InvalidArgumentError(
      absl::StrCat("algorithm.name: unknown algorithm '", config.name,
                   "' (grpo, flow_grpo_fast, grpo_guard, mix_grpo, dance_grpo, sft, dpo or vae)"));
}

}  // namespace dray
