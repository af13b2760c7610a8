// trainer.async with real worker processes: a rollout group samples a step
// ahead with weights at most trainer.max_staleness steps old, the trained
// workers adopt each rollout and weigh its samples by their importance
// ratio against the policy that sampled them; the log-prob gap between the
// two is measured every step, and is 0 where they are the same weights.
#include <signal.h>

#include <atomic>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/train/train_test_util.h"
#include "workers/train/trainer.h"

namespace dray {
namespace {

using ::testing::ElementsAre;

std::vector<double> Column(const std::vector<nlohmann::json>& steps, const char* key) {
  std::vector<double> values;
  for (const nlohmann::json& step : steps) values.push_back(step.value(key, 0.0));
  return values;
}

TEST(AsyncTest, RolloutsRunAheadWithinTheStalenessBound) {
  const std::string dir = SaveDir("async");
  DRAY_ASSERT_OK_AND_ASSIGN(
      auto trainer, StartTrainer(SmallJob(dir, {"trainer.async=true", "trainer.max_staleness=2",
                                                "trainer.total_steps=5"}),
                                 1));
  DRAY_ASSERT_OK(trainer->Run());
  const std::vector<nlohmann::json> steps = StepMetrics(dir);
  ASSERT_EQ(steps.size(), 5u);
  // Sampled at once with the synced weights, then ahead: the weights are
  // synced again when a rollout would be 3 steps old.
  EXPECT_THAT(Column(steps, "staleness"), ElementsAre(0, 1, 2, 1, 2));
  EXPECT_THAT(Column(steps, "weights_synced"), ElementsAre(1, 0, 1, 0, 0));
  // The same weights in another process: the same log-probs, bit for bit.
  EXPECT_EQ(steps[0]["logprob_gap_max"].get<double>(), 0);
  EXPECT_EQ(steps[0]["rollout_is_mean"].get<double>(), 1);
  for (size_t step = 1; step < steps.size(); ++step) {
    SCOPED_TRACE(step);
    EXPECT_GT(steps[step]["logprob_gap_max"].get<double>(), 0) << "an older policy sampled";
    EXPECT_NE(steps[step]["rollout_is_mean"].get<double>(), 1) << "weighed against it";
  }
}

TEST(AsyncTest, SynchronousStepsHaveNoStalenessAndNoLogProbGap) {
  const std::string dir = SaveDir("sync");
  DRAY_ASSERT_OK_AND_ASSIGN(auto trainer,
                            StartTrainer(SmallJob(dir, {"trainer.total_steps=3"}), 2));
  DRAY_ASSERT_OK(trainer->Run());
  for (const nlohmann::json& step : StepMetrics(dir)) {
    EXPECT_EQ(step["staleness"].get<double>(), 0) << step;
    EXPECT_EQ(step["logprob_gap_max"].get<double>(), 0) << step;
    EXPECT_FALSE(step.contains("rollout_is_mean")) << step;
  }
}

// A resumed asynchronous run samples its first step at once with the
// restored weights (staleness 0), then runs ahead again.
TEST(AsyncTest, AStopAndAResumeRunOnAhead) {
  const std::string dir = SaveDir("async_resumed");
  DRAY_ASSERT_OK(
      StartTrainer(
          SmallJob(dir, {"trainer.async=true", "trainer.total_steps=2", "trainer.save_every=2"}), 1)
          .value()
          ->Run());
  DRAY_ASSERT_OK_AND_ASSIGN(
      auto resumed, StartTrainer(SmallJob(dir, {"trainer.async=true", "trainer.total_steps=4",
                                                "trainer.resume=auto"}),
                                 1));
  DRAY_ASSERT_OK(resumed->Run());
  const std::vector<nlohmann::json> steps = StepMetrics(dir);
  ASSERT_EQ(steps.size(), 4u);
  EXPECT_THAT(Column(steps, "staleness"), ElementsAre(0, 1, 0, 1));
}

// A trained worker killed while the rollout group samples ahead: the
// groups restart from the last checkpoint and the run finishes, its
// rollouts sampled at once again after the restart (staleness 0).
TEST(AsyncTest, AWorkerKilledWhileSamplingAheadIsRestarted) {
  const std::string dir = SaveDir("async_killed");
  FlowGrpoTrainer* running = nullptr;
  std::atomic<int> rollouts{0};
  std::atomic<pid_t> killed{0};
  FlowGrpoTrainer::Options options;
  options.on_rollout_progress = [&](int, const std::string& what, int64_t done, int64_t) {
    // The first denoising step of the third rollout: step 2's, sampled ahead.
    if (what != "denoising" || done != 1 || ++rollouts != 3) return;
    killed = running->group().pids()[0];
    kill(killed, SIGKILL);
  };
  DRAY_ASSERT_OK_AND_ASSIGN(
      auto trainer, StartTrainer(SmallJob(dir, {"trainer.async=true", "trainer.total_steps=4",
                                                "trainer.save_every=1", "trainer.max_restarts=1"}),
                                 1, options));
  running = trainer.get();
  DRAY_ASSERT_OK(trainer->Run());
  EXPECT_NE(killed.load(), 0);
  EXPECT_EQ(trainer->restarts(), 1);
  const std::vector<nlohmann::json> steps = StepMetrics(dir);
  ASSERT_EQ(steps.size(), 4u);
  EXPECT_EQ(steps[0]["staleness"].get<double>(), 0);
  EXPECT_EQ(steps[3]["staleness"].get<double>(), 1);
}

// Measured (seed 0): the embedded task's reward 0.2067 -> 0.2458 at step
// 9, one step behind synchronous GRPO's (0.2439 at step 8), as its
// rollouts are; the rise below is 0.026 (synchronous: 0.036).
TEST(AsyncTest, TheEmbeddedTaskIsLearnedAStepOffPolicy) {
  const std::string dir = SaveDir("async_learns");
  DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig config,
                            TrainConfig::Load("", {"trainer.async=true", "trainer.total_steps=10",
                                                   "trainer.save_dir=" + dir}));
  DRAY_ASSERT_OK_AND_ASSIGN(auto trainer, StartTrainer(config, 1));
  DRAY_ASSERT_OK(trainer->Run());
  const std::vector<nlohmann::json> steps = StepMetrics(dir);
  ASSERT_EQ(steps.size(), 10u);
  EXPECT_GT(MeanOf(steps, "reward_mean", 7, 10) - MeanOf(steps, "reward_mean", 0, 3), 0.02);
}

}  // namespace
}  // namespace dray
