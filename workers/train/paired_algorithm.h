// PairedAlgorithm: a step on pairs (algorithm.name sft, vae or dpo): one
// optimizer step on the workers on the step's pairs (PromptSampler's
// PairedRows: each input image with its target and a sigma draw; DPO's
// with the rejected edit and its draws), and when samples are due, what
// the model makes of the inputs now beside what they should become (the
// VAE: the inputs and their reconstructions). DPO with reward functions
// also scores the model's edits of the step's inputs before its update.
// docs/training.md, "Supervised fine-tuning", "Diffusion-DPO" and
// "Training the VAE".
//
// Thread-safety: not thread-safe.
#ifndef DRAY_WORKERS_TRAIN_PAIRED_ALGORITHM_H_
#define DRAY_WORKERS_TRAIN_PAIRED_ALGORITHM_H_

#include <vector>

#include "workers/train/train_config.h"
#include "workers/train/training_algorithm.h"
#include "workers/train/training_workers.h"

namespace dray {

class PairedAlgorithm : public TrainingAlgorithm {
 public:
  // `config` names the algorithm (sft, vae or dpo) and DPO's reward
  // functions.
  explicit PairedAlgorithm(const TrainConfig& config);

  absl::StatusOr<Metrics> Step(int64_t step, const StepContext& context) override;
  std::vector<ChartSpec> Charts() const override;

 private:
  TrainConfig config_;
  PairedKind kind_;
};

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_PAIRED_ALGORITHM_H_
