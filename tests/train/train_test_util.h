// Shared pieces of the training tests: short jobs on the embedded task,
// trainers over real `dray worker` processes, and what a run leaves behind.
#ifndef DRAY_TESTS_TRAIN_TRAIN_TEST_UTIL_H_
#define DRAY_TESTS_TRAIN_TRAIN_TEST_UTIL_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "workers/train/trainer.h"

namespace dray {

// SaveDir: a fresh path under the test's temporary directory.
std::string SaveDir(const std::string& name);

// RandomTinyModel: a random tiny model directory (seed 0, written once per
// process): the training tests check the trainer's mechanics on it, apart
// from the embedded model's trained weights.
const std::string& RandomTinyModel();

// SmallJob: the embedded task on RandomTinyModel with guidance, shortened
// (2 prompts x 2 samples, 4 denoising steps, micro-batches of 1, 2
// training steps, LR 3e-2: what the tolerances of the tests using it were
// measured at, whatever the embedded default), then `overrides`.
TrainConfig SmallJob(const std::string& save_dir, std::vector<std::string> overrides = {});

// StartTrainer starts a trainer with `workers` worker processes.
absl::StatusOr<std::unique_ptr<FlowGrpoTrainer>> StartTrainer(
    const TrainConfig& config, int workers, FlowGrpoTrainer::Options options = {});

// LoraWeights reads a run's final adapters (empty, with a test failure, when absent).
std::map<std::string, at::Tensor> LoraWeights(const std::string& save_dir);

}  // namespace dray

#endif  // DRAY_TESTS_TRAIN_TRAIN_TEST_UTIL_H_
