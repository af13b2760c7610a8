// PairedAlgorithm: a step on pairs (algorithm.name sft or vae): one
// optimizer step on the workers on the step's pairs (PromptSampler's
// PairedRows: each input image with its target and a sigma draw), and
// when samples are due, what the model makes of the inputs now beside what
// they should become (the VAE: the inputs and their reconstructions).
// docs/training.md, "Supervised fine-tuning" and "Training the VAE".
//
// Thread-safety: not thread-safe.
#ifndef DRAY_WORKERS_TRAIN_PAIRED_ALGORITHM_H_
#define DRAY_WORKERS_TRAIN_PAIRED_ALGORITHM_H_

#include <vector>

#include "workers/train/training_algorithm.h"

namespace dray {

class PairedAlgorithm : public TrainingAlgorithm {
 public:
  // `vae`: the VAE's reconstruction training, else SFT of the transformer.
  explicit PairedAlgorithm(bool vae) : vae_(vae) {}

  absl::StatusOr<Metrics> Step(int64_t step, const StepContext& context) override;
  std::vector<ChartSpec> Charts() const override;

 private:
  bool vae_;
};

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_PAIRED_ALGORITHM_H_
