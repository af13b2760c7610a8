// TrainingAlgorithm: one training step of an algorithm (algorithm.name), as
// FlowGrpoTrainer's loop runs it: what it asks of the workers, the metrics
// it returns, the samples it draws and the curves it charts. The
// algorithms are registered by name in algorithms.h.
//
//   DRAY_ASSIGN_OR_RETURN(Metrics metrics, algorithm->Step(step, context));
//
// Thread-safety: not thread-safe (the trainer's loop calls it).
#ifndef DRAY_WORKERS_TRAIN_TRAINING_ALGORITHM_H_
#define DRAY_WORKERS_TRAIN_TRAINING_ALGORITHM_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "workers/train/plot.h"
#include "workers/train/prompt_sampler.h"
#include "workers/train/train_config.h"
#include "workers/train/training_workers.h"

namespace dray {

// Metrics: one step's metrics by name (metrics.jsonl's keys).
using Metrics = std::map<std::string, double>;

// StepContext: what a step works with.
struct StepContext {
  const PromptSampler& sampler;
  TrainingWorkers& workers;
  double lr = 0;             // this step's learning rate (warm-up applied)
  bool samples_due = false;  // whether this step draws samples/step_N.png
  // WriteSamples writes this step's samples/step_N.png.
  std::function<absl::Status(const std::vector<SampleRow>&)> write_samples;
  // on_rollout_progress receives the workers' progress within a rollout
  // (DMD2: within its step).
  GroupProgressFn on_rollout_progress;
};

// CurveSpec: one series of curves.png: the metric `key`, labelled `label`.
struct CurveSpec {
  std::string key;
  std::string label;
  Rgb color;
};

// ChartSpec: one chart of curves.png.
struct ChartSpec {
  std::string title;
  std::vector<CurveSpec> curves;
};

class TrainingAlgorithm {
 public:
  virtual ~TrainingAlgorithm() = default;

  // Step runs step `step` and returns its metrics (with "images_per_s");
  // the trainer adds "step" and records them.
  virtual absl::StatusOr<Metrics> Step(int64_t step, const StepContext& context) = 0;

  // Charts: what curves.png shows, top to bottom.
  virtual std::vector<ChartSpec> Charts() const = 0;
};

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_TRAINING_ALGORITHM_H_
