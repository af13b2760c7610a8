#include "workers/bench/train_bench.h"

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "workers/image/image_codec.h"
#include "workers/train/plot.h"
#include "workers/train/trainer.h"

namespace dray {
namespace {

// BusiestWorkerSeconds: the most time any rank has spent inside rollout and
// update_actor so far.
absl::StatusOr<double> BusiestWorkerSeconds(WorkerGroup& group) {
  DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> ranks, group.Call("timings", {DataProto()}));
  double busiest = 0;
  for (const DataProto& rank : ranks) {
    double busy = 0;
    for (const char* method : {"rollout", "update_actor"})
      busy += rank.GetMeta<double>(method).value_or(0);
    busiest = std::max(busiest, busy);
  }
  return busiest;
}

// AlgorithmRun: one algorithm's rewards against the seconds since its first step.
struct AlgorithmRun {
  std::string algorithm;
  std::vector<double> seconds, rewards;
  double images_per_s = 0;
};

// RunAlgorithm trains `algorithm` on the embedded task until `budget`
// seconds have passed (or `max_steps` steps), one worker.
absl::StatusOr<AlgorithmRun> RunAlgorithm(const TrainBenchOptions& options,
                                          const std::string& algorithm, double budget,
                                          int max_steps) {
  DRAY_ASSIGN_OR_RETURN(ScratchDir save, ScratchDir::Create("dray-train-bench"));
  DRAY_ASSIGN_OR_RETURN(
      TrainConfig config,
      TrainConfig::Load("", {"trainer.save_dir=" + save.path(), "trainer.sample_every=1000",
                             "algorithm.name=" + algorithm}));
  FlowGrpoTrainer::Options start;
  start.launch.workers = 1;
  start.launch.worker_command = options.worker_command;
  DRAY_ASSIGN_OR_RETURN(auto trainer, FlowGrpoTrainer::Start(config, start));
  AlgorithmRun run{algorithm};
  const absl::Time started = absl::Now();
  double elapsed = 0;
  for (int step = 0; step < max_steps && elapsed < budget; ++step) {
    DRAY_ASSIGN_OR_RETURN(auto step_metrics, trainer->Step(step));
    elapsed = absl::ToDoubleSeconds(absl::Now() - started);
    run.seconds.push_back(elapsed);
    run.rewards.push_back(step_metrics.at("reward_mean"));
  }
  run.images_per_s = static_cast<double>(config.rows_per_step() * run.rewards.size()) / elapsed;
  return run;
}

// CompareAlgorithms emits each algorithm's figures and draws their chart.
absl::Status CompareAlgorithms(const TrainBenchOptions& options,
                               const std::function<void(std::string, double, std::string)>& emit) {
  const std::vector<std::pair<std::string, Rgb>> algorithms = {
      {"grpo", {220, 60, 40}},        {"flow_grpo_fast", {40, 120, 220}},
      {"grpo_guard", {40, 160, 60}},  {"mix_grpo", {160, 60, 200}},
      {"dance_grpo", {200, 150, 30}}, {"diffusion_nft", {30, 170, 170}},
      {"dpo", {90, 90, 90}}};
  std::vector<Series> lines;
  for (const auto& [algorithm, color] : algorithms) {
    DRAY_ASSIGN_OR_RETURN(
        AlgorithmRun run,
        RunAlgorithm(options, algorithm, options.quick ? 1e9 : 60, options.quick ? 2 : 1000));
    const std::string prefix = "train_" + algorithm;
    emit(prefix + "_images_per_s", run.images_per_s, "images/s");
    emit(prefix + "_reward_first", run.rewards.front(), "reward");
    emit(prefix + "_reward_last", run.rewards.back(), "reward");
    lines.push_back({algorithm, color, run.seconds, run.rewards});
  }
  if (options.plot_path.empty()) return absl::OkStatus();
  DRAY_ASSIGN_OR_RETURN(std::string png,
                        EncodePng(LineChart("reward", lines, 640, 320, "seconds")));
  return WriteFile(options.plot_path, png);
}

// GuidedConfig: the embedded task with guidance, saving into `save_dir`,
// with `overrides`.
absl::StatusOr<TrainConfig> GuidedConfig(const std::string& save_dir,
                                         std::vector<std::string> overrides = {}) {
  overrides.insert(overrides.end(), {"trainer.save_dir=" + save_dir, "trainer.sample_every=1000",
                                     "worker.image_edit.negative_prompt=\" \""});
  return TrainConfig::Load("", overrides);
}

// AsyncStepSeconds: the mean step of trainer.async with one trained worker
// and one rollout worker (2 processes) over `steps` steps after a warm-up.
absl::StatusOr<double> AsyncStepSeconds(const TrainBenchOptions& options, int steps) {
  DRAY_ASSIGN_OR_RETURN(ScratchDir save, ScratchDir::Create("dray-train-bench"));
  DRAY_ASSIGN_OR_RETURN(TrainConfig config, GuidedConfig(save.path(), {"trainer.async=true"}));
  FlowGrpoTrainer::Options start;
  start.launch.workers = 1;
  start.launch.worker_command = options.worker_command;
  DRAY_ASSIGN_OR_RETURN(auto trainer, FlowGrpoTrainer::Start(config, start));
  DRAY_RETURN_IF_ERROR(trainer->Step(0).status());  // warm-up; step 1 starts sampling
  const absl::Time started = absl::Now();
  for (int step = 1; step <= steps; ++step) DRAY_RETURN_IF_ERROR(trainer->Step(step).status());
  return absl::ToDoubleSeconds(absl::Now() - started) / steps;
}

}  // namespace

absl::StatusOr<std::vector<BenchMetric>> RunTrainBench(const TrainBenchOptions& options) {
  std::vector<BenchMetric> metrics;
  auto emit = [&](std::string name, double value, std::string unit) {
    metrics.push_back({std::move(name), value, std::move(unit)});
    if (options.report) options.report(metrics.back());
  };
  const int steps = options.quick ? 1 : 5;
  std::map<int, double> step_seconds;
  for (int workers : {1, 2}) {
    DRAY_ASSIGN_OR_RETURN(ScratchDir save, ScratchDir::Create("dray-train-bench"));
    DRAY_ASSIGN_OR_RETURN(TrainConfig config, GuidedConfig(save.path()));
    FlowGrpoTrainer::Options start;
    start.launch.workers = workers;
    start.launch.worker_command = options.worker_command;
    DRAY_ASSIGN_OR_RETURN(auto trainer, FlowGrpoTrainer::Start(config, start));
    DRAY_RETURN_IF_ERROR(trainer->Step(0).status());  // warm-up
    DRAY_ASSIGN_OR_RETURN(const double busy_before, BusiestWorkerSeconds(trainer->group()));
    const GroupTraffic traffic_before = trainer->group().traffic();
    std::map<std::string, double> phases;
    const absl::Time started = absl::Now();
    for (int step = 1; step <= steps; ++step) {
      DRAY_ASSIGN_OR_RETURN(auto step_metrics, trainer->Step(step));
      for (const char* phase : {"rollout_s", "reward_s", "update_s"})
        phases[phase] += step_metrics.at(phase) / steps;
    }
    const double wall = absl::ToDoubleSeconds(absl::Now() - started);
    DRAY_ASSIGN_OR_RETURN(const double busy_after, BusiestWorkerSeconds(trainer->group()));
    const GroupTraffic traffic = trainer->group().traffic();
    const double moved =
        static_cast<double>(traffic.sent_bytes - traffic_before.sent_bytes +
                            traffic.received_bytes - traffic_before.received_bytes);
    const std::string w = absl::StrCat("_w", workers);
    step_seconds[workers] = wall / steps;
    emit("train_step_s" + w, wall / steps, "s");
    emit("train_rollout_s" + w, phases["rollout_s"], "s");
    emit("train_reward_s" + w, phases["reward_s"], "s");
    emit("train_update_s" + w, phases["update_s"], "s");
    emit("train_images_per_s" + w, static_cast<double>(config.rows_per_step() * steps) / wall,
         "images/s");
    emit("train_moved_mb_per_step" + w, moved / steps / 1e6, "MB");
    emit("train_controller_share" + w, 100.0 * (wall - (busy_after - busy_before)) / wall, "%");
  }
  emit("train_speedup_w2", step_seconds[1] / step_seconds[2], "x");
  DRAY_ASSIGN_OR_RETURN(const double async_step, AsyncStepSeconds(options, steps));
  emit("train_step_s_async", async_step, "s");
  emit("train_async_speedup_w2", step_seconds[2] / async_step, "x");
  DRAY_RETURN_IF_ERROR(CompareAlgorithms(options, emit));
  return metrics;
}

}  // namespace dray
