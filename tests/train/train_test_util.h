// Shared pieces of the training tests: short jobs on the embedded task,
// trainers over real `dray worker` processes, and what a run leaves behind.
#ifndef DRAY_TESTS_TRAIN_TRAIN_TEST_UTIL_H_
#define DRAY_TESTS_TRAIN_TRAIN_TEST_UTIL_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <nlohmann/json.hpp>

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
// training steps, LR 3e-2, the `color` reward: what the tolerances of the
// tests using it were measured at, whatever the embedded defaults), then
// `overrides`.
TrainConfig SmallJob(const std::string& save_dir, std::vector<std::string> overrides = {});

// Two runs of SmallJob that take the same sums in the same order (a stop
// and a resume, a restart at the same world size, every sharding strategy
// at one world size) end bit for bit alike. Runs that sum gradients in
// another order (another world size) do not agree to any fixed float32
// bound, measured (AMD EPYC, OpenBLAS Haswell kernels): one step at two
// ranks instead of one leaves the weights a few ulps apart (6e-8); the next
// rollout's images then round a byte or so differently, which moves a
// reward by ~1e-7, and the group-normalised advantages (two samples a
// prompt, rewards ~1e-3 apart on the random model) and Adam at LR 3e-2
// carry that into every weight: 7e-5 apart one step later (9e-5 seen
// elsewhere, 1e-5 on the machine the tests were written on). In float64
// the same runs end 1e-16 and 1e-15 apart: a rounding difference is 2^-29
// of float32's, far too small to flip a byte, and grows smoothly.
//
// kFloat64: the override that computes, and keeps masters, in float64.
inline constexpr char kFloat64[] = "worker.image_edit.torch_dtype=float64";
// kFloat64OrderBound: how far apart (any weight, any reward) two float64
// runs of SmallJob may end when they sum in another order: the largest
// float32 spread seen (1e-4) scaled by 2^-29, times 1000 for machines whose
// kernels round otherwise. A fault in what carries over (a lost optimizer
// moment, a skipped sample, another seed) moves weights by ~LR (3e-2).
inline constexpr double kFloat64OrderBound = 1e-4 / (1 << 29) * 1000;

// StartTrainer starts a trainer with `workers` worker processes.
absl::StatusOr<std::unique_ptr<FlowGrpoTrainer>> StartTrainer(
    const TrainConfig& config, int workers, FlowGrpoTrainer::Options options = {});

// StepMetrics reads a run's metrics.jsonl, a line per step; MeanOf is the
// mean of `key` over steps [from, to).
std::vector<nlohmann::json> StepMetrics(const std::string& save_dir);
double MeanOf(const std::vector<nlohmann::json>& steps, const char* key, size_t from, size_t to);

// LoraWeights reads a run's final adapters (empty, with a test failure, when absent).
std::map<std::string, at::Tensor> LoraWeights(const std::string& save_dir);

}  // namespace dray

#endif  // DRAY_TESTS_TRAIN_TRAIN_TEST_UTIL_H_
