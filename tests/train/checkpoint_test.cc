// Training jobs that last: checkpoints, resume and restarts, with real
// worker processes and the embedded tiny model. A run stopped and resumed
// (also at another world size), and a run whose worker is killed in the
// middle of a step, end with the weights and metrics of a run that never
// stopped.
#include <signal.h>

#include <ATen/ATen.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/train/train_test_util.h"
#include "workers/train/trainer.h"

namespace dray {
namespace {

namespace fs = std::filesystem;
using ::dray::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kSteps = 4;

// Job: SmallJob, 4 steps.
TrainConfig Job(const std::string& save_dir, std::vector<std::string> overrides = {}) {
  overrides.insert(overrides.begin(), absl::StrCat("trainer.total_steps=", kSteps));
  return SmallJob(save_dir, std::move(overrides));
}

absl::Status Train(const TrainConfig& config, int workers = 1) {
  DRAY_ASSIGN_OR_RETURN(auto trainer, StartTrainer(config, workers));
  return trainer->Run();
}

// Uninterrupted: the run the others must equal, at 1 or 2 workers, with
// `overrides` (trained once per process).
const std::string& Uninterrupted(int workers, const std::vector<std::string>& overrides = {}) {
  static std::map<std::pair<int, std::vector<std::string>>, std::string> dirs;
  const auto key = std::make_pair(workers, overrides);
  if (!dirs.count(key)) {
    const std::string path = SaveDir(absl::StrCat("uninterrupted_", dirs.size()));
    EXPECT_TRUE(Train(Job(path, overrides), workers).ok());
    dirs[key] = path;
  }
  return dirs[key];
}

// ExpectSameRun: the run in `dir` ended with the weights and each step's
// `metric` of `uninterrupted`, to `tolerance` (0: bit for bit).
void ExpectSameRun(const std::string& dir, const std::string& uninterrupted, double tolerance,
                   const char* metric = "reward_mean") {
  const auto expected = LoraWeights(uninterrupted), actual = LoraWeights(dir);
  ASSERT_FALSE(expected.empty());
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, tensor] : expected)
    EXPECT_LE((actual.at(name) - tensor).abs().max().item<double>(), tolerance) << name;
  const auto expected_metrics = StepMetrics(uninterrupted), metrics = StepMetrics(dir);
  ASSERT_EQ(metrics.size(), static_cast<size_t>(kSteps));  // each step once
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_EQ(metrics[step]["step"], step);
    EXPECT_NEAR(metrics[step][metric].get<double>(), expected_metrics[step][metric].get<double>(),
                tolerance);
  }
}

std::vector<std::string> CheckpointNames(const std::string& save_dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(save_dir + "/checkpoints"))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(CheckpointTest, AStopAndAResumeEqualAnUninterruptedRun) {
  const std::string dir = SaveDir("stopped");
  DRAY_ASSERT_OK(Train(Job(dir, {"trainer.total_steps=2", "trainer.save_every=1"})));
  EXPECT_THAT(CheckpointNames(dir), ElementsAre("step_000001", "step_000002"));  // keep_last 2
  DRAY_ASSERT_OK(Train(Job(dir, {"trainer.save_every=1", "trainer.resume=auto"})));
  ExpectSameRun(dir, Uninterrupted(1), 0);
  EXPECT_THAT(CheckpointNames(dir), ElementsAre("step_000003", "step_000004"));
  // Resuming a finished run trains nothing more.
  DRAY_ASSERT_OK(Train(Job(dir, {"trainer.resume=auto"})));
  ExpectSameRun(dir, Uninterrupted(1), 0);
}

// DiffusionNFT's sampling policy trails the trained one: a checkpoint
// holds it, or the resumed run would roll out with other weights.
TEST(CheckpointTest, DiffusionNftResumesWithItsSamplingPolicy) {
  const std::vector<std::string> nft = {"algorithm.name=diffusion_nft", "algorithm.decay_type=1"};
  const std::string dir = SaveDir("nft_stopped");
  std::vector<std::string> first = nft, second = nft;
  first.insert(first.end(), {"trainer.total_steps=2", "trainer.save_every=2"});
  second.push_back("trainer.resume=auto");
  DRAY_ASSERT_OK(Train(Job(dir, first)));
  EXPECT_TRUE(
      fs::exists(dir + "/checkpoints/step_000002/sampling_policy-00000-of-00001.safetensors"));
  DRAY_ASSERT_OK(Train(Job(dir, second)));
  ExpectSameRun(dir, Uninterrupted(1, nft), 0);
}

// DMD2's job: two generator steps on the tiny model (at steps 0 and 2 of
// 4), its fake score learning every step.
TrainConfig Dmd2Job(const std::string& save_dir, std::vector<std::string> overrides = {}) {
  overrides.insert(overrides.begin(),
                   {"worker.image_edit.model_path=" + RandomTinyModel(),
                    "worker.image_edit.negative_prompt=\" \"", "algorithm.name=dmd2",
                    "algorithm.num_denoising_step=2", "algorithm.dfake_gen_update_ratio=2",
                    "data.prompts_per_step=2", "worker.actor.micro_batch_size=1",
                    "worker.actor.lr=3e-2", "algorithm.guidance_lr=1e-2",
                    "worker.reward.functions=[target_psnr]", "trainer.sample_every=1000",
                    absl::StrCat("trainer.total_steps=", kSteps), "trainer.save_dir=" + save_dir});
  absl::StatusOr<TrainConfig> config = TrainConfig::Load("", overrides);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

const std::string& UninterruptedDmd2(int workers, const std::vector<std::string>& overrides = {}) {
  static std::map<std::pair<int, std::vector<std::string>>, std::string> dirs;
  const auto key = std::make_pair(workers, overrides);
  if (!dirs.count(key)) {
    const std::string path = SaveDir(absl::StrCat("uninterrupted_dmd2_", dirs.size()));
    EXPECT_TRUE(Train(Dmd2Job(path, overrides), workers).ok());
    dirs[key] = path;
  }
  return dirs[key];
}

// DMD2's checkpoint holds its three models' trained state: the generator,
// and the fake score with its own optimizer (the real score is the
// model's); a resumed run's generator steps after the fake score's
// restored ones as if it had never stopped.
TEST(CheckpointTest, Dmd2ResumesWithItsFakeScore) {
  const std::string dir = SaveDir("dmd2_stopped");
  DRAY_ASSERT_OK(Train(Dmd2Job(dir, {"trainer.total_steps=2", "trainer.save_every=2"})));
  const std::string fake = dir + "/checkpoints/step_000002/fake_score/";
  EXPECT_TRUE(fs::exists(fake + "model-00000-of-00001.safetensors"));
  EXPECT_TRUE(fs::exists(fake + "adamw.json"));
  DRAY_ASSERT_OK(Train(Dmd2Job(dir, {"trainer.resume=auto"})));
  ExpectSameRun(dir, UninterruptedDmd2(1), 0, "loss_fake_mean");
}

// With DMD2's GAN the classifier head is a part of the fake score's
// shards: it resumes with them.
TEST(CheckpointTest, Dmd2ResumesWithItsClassifier) {
  const std::vector<std::string> gan = {"algorithm.cls_on_clean_image=true",
                                        "algorithm.gen_cls_loss_weight=1",
                                        "algorithm.guidance_cls_loss_weight=1"};
  const std::string dir = SaveDir("dmd2_gan_stopped");
  std::vector<std::string> first = gan, second = gan;
  first.insert(first.end(), {"trainer.total_steps=2", "trainer.save_every=2"});
  second.push_back("trainer.resume=auto");
  DRAY_ASSERT_OK(Train(Dmd2Job(dir, first)));
  DRAY_ASSERT_OK(Train(Dmd2Job(dir, second)));
  ExpectSameRun(dir, UninterruptedDmd2(1, gan), 0, "guidance_cls_loss");
}

// A worker killed in DMD2's step: the group restarts from the last
// checkpoint, all three models as they were.
TEST(CheckpointTest, ADmd2WorkerKilledMidStepIsRestartedFromTheLastCheckpoint) {
  const std::string dir = SaveDir("dmd2_killed");
  FlowGrpoTrainer* running = nullptr;
  std::atomic<int> steps{0};
  std::atomic<pid_t> killed{0};
  FlowGrpoTrainer::Options options;
  options.on_rollout_progress = [&](int rank, const std::string& what, int64_t done, int64_t) {
    // Rank 1's first micro-batch of the third step (after the checkpoint of step 2).
    if (rank != 1 || what != "distilling" || done != 1 || ++steps != 3) return;
    killed = running->group().pids()[1];
    kill(killed, SIGKILL);
  };
  DRAY_ASSERT_OK_AND_ASSIGN(
      auto trainer,
      StartTrainer(Dmd2Job(dir, {"trainer.save_every=1", "trainer.max_restarts=1"}), 2, options));
  running = trainer.get();
  DRAY_ASSERT_OK(trainer->Run());
  EXPECT_NE(killed.load(), 0);
  EXPECT_EQ(trainer->restarts(), 1);
  ExpectSameRun(dir, UninterruptedDmd2(2), 0, "loss_fake_mean");
}

// Resuming an earlier checkpoint abandons the later ones: they are moved
// aside, never mixed with (or pruned in favour of) the new run's.
TEST(CheckpointTest, ResumingAnEarlierCheckpointSetsTheLaterOnesAside) {
  const std::string dir = SaveDir("rewound");
  DRAY_ASSERT_OK(Train(Job(dir, {"trainer.save_every=1", "trainer.keep_last=4"})));
  DRAY_ASSERT_OK(Train(Job(dir, {"trainer.save_every=1", "trainer.keep_last=1",
                                 "trainer.resume=" + dir + "/checkpoints/step_000002"})));
  ExpectSameRun(dir, Uninterrupted(1), 0);
  EXPECT_THAT(CheckpointNames(dir), ElementsAre("abandoned_after_step_2", "step_000004"));
  EXPECT_TRUE(fs::exists(dir + "/checkpoints/abandoned_after_step_2/step_000003"));
}

// Two ranks sum gradients in another order than one: compared in float64
// (train_test_util.h says why).
TEST(CheckpointTest, ACheckpointResumesAtAnotherWorldSize) {
  const std::string dir = SaveDir("rescaled");
  DRAY_ASSERT_OK(Train(Job(dir, {kFloat64, "trainer.total_steps=2", "trainer.save_every=2"}), 1));
  DRAY_ASSERT_OK(Train(Job(dir, {kFloat64, "trainer.resume=auto"}), 2));
  ExpectSameRun(dir, Uninterrupted(1, {kFloat64}), kFloat64OrderBound);
}

TEST(CheckpointTest, AnUnfinishedSaveIsIgnoredAndRemoved) {
  const std::string dir = SaveDir("crashed_mid_save");
  DRAY_ASSERT_OK(Train(Job(dir, {"trainer.total_steps=2", "trainer.save_every=2"})));
  // A save that crashed half-way: a partial folder, and one without its state.
  fs::create_directories(dir + "/checkpoints/.step_000003.partial");
  fs::create_directories(dir + "/checkpoints/step_000003");
  DRAY_ASSERT_OK(Train(Job(dir, {"trainer.resume=auto"})));
  ExpectSameRun(dir, Uninterrupted(1), 0);
  EXPECT_FALSE(fs::exists(dir + "/checkpoints/.step_000003.partial"));
}

TEST(CheckpointTest, ResumeErrorsNameTheCheckpoint) {
  const std::string dir = SaveDir("bad_resume");
  EXPECT_THAT(StartTrainer(Job(dir, {"trainer.resume=" + dir + "/nowhere"}), 1).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nowhere is not a directory")));
  DRAY_ASSERT_OK(Train(Job(dir, {"trainer.total_steps=2", "trainer.save_every=2"})));
  // A new run would mix its checkpoints with the earlier run's.
  EXPECT_THAT(StartTrainer(Job(dir), 1).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("holds checkpoints of an earlier run")));
  EXPECT_THAT(
      StartTrainer(Job(dir, {"trainer.resume=auto", "worker.actor.lora_rank=4"}), 1).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("step_000002")));
}

// SIGKILL of a worker while it denoises a step's rollout: the group is
// restarted, the last checkpoint reloaded, and the run ends as if nothing
// had happened.
TEST(CheckpointTest, AWorkerKilledMidStepIsRestartedFromTheLastCheckpoint) {
  const std::string dir = SaveDir("killed");
  FlowGrpoTrainer* running = nullptr;
  std::atomic<int> rollouts{0};
  std::atomic<pid_t> killed{0};
  FlowGrpoTrainer::Options options;
  options.on_rollout_progress = [&](int rank, const std::string& what, int64_t done, int64_t) {
    // Rank 1's first denoising step of the second step's rollout.
    if (rank != 1 || what != "denoising" || done != 1 || ++rollouts != 2) return;
    killed = running->group().pids()[1];
    kill(killed, SIGKILL);
  };
  DRAY_ASSERT_OK_AND_ASSIGN(
      auto trainer,
      StartTrainer(Job(dir, {"trainer.save_every=1", "trainer.max_restarts=1"}), 2, options));
  running = trainer.get();
  DRAY_ASSERT_OK(trainer->Run());
  EXPECT_NE(killed.load(), 0);
  EXPECT_EQ(trainer->restarts(), 1);
  ExpectSameRun(dir, Uninterrupted(2), 0);
}

}  // namespace
}  // namespace dray
