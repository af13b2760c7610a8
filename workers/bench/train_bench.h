// The training benchmark, run by `dray bench --suite train`: Flow-GRPO steps
// of the embedded task (tiny model, 16 samples of 64^2 a step, 8 denoising
// steps) through real worker processes, at 1 and 2 workers, in one run:
//   train_step_s_wN              seconds per RL step (after a warm-up step)
//   train_rollout_s_wN, train_reward_s_wN, train_update_s_wN   its phases
//   train_images_per_s_wN        samples generated and trained per second
//   train_controller_share_wN    the step's time not spent inside the busiest
//                                worker's methods (%): dispatch, transfers,
//                                rewards, advantages, logging
//   train_moved_mb_per_step_wN   what a step's calls move between the
//                                controller and the model's workers, both ways
//   train_speedup_w2             train_step_s_w1 / train_step_s_w2
// and each GRPO algorithm (grpo, flow_grpo_fast, grpo_guard) on the embedded
// task at its defaults, one worker, for the same wall-clock budget (60 s;
// --quick: 2 steps each):
//   train_<algorithm>_images_per_s   samples generated and trained per second
//   train_<algorithm>_reward_first   the mean reward of the first step
//   train_<algorithm>_reward_last    of the last step within the budget
// with, where `plot_path` is set, their rewards against wall-clock seconds
// in one chart (PNG).
#ifndef DRAY_WORKERS_BENCH_TRAIN_BENCH_H_
#define DRAY_WORKERS_BENCH_TRAIN_BENCH_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/bench/bench_metric.h"

namespace dray {

struct TrainBenchOptions {
  std::vector<std::string> worker_command;  // `dray worker`
  bool quick = false;
  BenchReporter report;
  std::string plot_path;  // the algorithms' reward-against-time chart; empty: none
};

absl::StatusOr<std::vector<BenchMetric>> RunTrainBench(const TrainBenchOptions& options);

}  // namespace dray

#endif  // DRAY_WORKERS_BENCH_TRAIN_BENCH_H_
