// Dmd2Algorithm: DMD2's step (algorithm.name dmd2; docs/training.md,
// "DMD2"): the step's rows (PromptSampler::Dmd2Rows: one per prompt, the
// backward simulation's depth, whether the generator learns) to the
// workers' dmd2_update, which updates the generator on the
// distribution-matching loss every dfake_gen_update_ratio-th step and the
// fake score every step; the learning-rate warm-up applies to both
// (worker.actor.lr and algorithm.guidance_lr). When samples are due, the
// generator's few-step edits beside the inputs (and targets, where the
// data has them), scored by the job's reward functions.
//
// Thread-safety: not thread-safe.
#ifndef DRAY_WORKERS_TRAIN_DMD2_ALGORITHM_H_
#define DRAY_WORKERS_TRAIN_DMD2_ALGORITHM_H_

#include <vector>

#include "workers/train/train_config.h"
#include "workers/train/training_algorithm.h"

namespace dray {

class Dmd2Algorithm : public TrainingAlgorithm {
 public:
  explicit Dmd2Algorithm(const TrainConfig& config) : config_(config) {}

  absl::StatusOr<Metrics> Step(int64_t step, const StepContext& context) override;
  std::vector<ChartSpec> Charts() const override;

 private:
  // WriteSamples: the generator's edits of the step's rows beside their
  // inputs (and targets), scored into `metrics` by the reward functions.
  absl::Status WriteSamples(int64_t step, const StepContext& context, const DataProto& rows,
                            Metrics& metrics) const;

  TrainConfig config_;
};

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_DMD2_ALGORITHM_H_
