// The training loop over FakeTrainingWorkers: what the trainer asks of its
// workers step by step, what it writes, and how it saves, resumes, restarts
// and skips, in milliseconds and without processes. (tests/train runs the
// same trainer on real workers.)
#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "base/files.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/train/testing/fake_training_workers.h"
#include "workers/train/trainer.h"
#include "workers/train/training_protocol.h"

namespace dray {
namespace {

namespace fs = std::filesystem;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class TrainerLoopTest : public ::testing::Test {
 protected:
  // Config: the embedded task, 2 prompts x 2 samples a step, saved under
  // this test's folder, with `overrides` after.
  TrainConfig Config(std::vector<std::string> overrides) const {
    overrides.insert(overrides.begin(),
                     {"data.prompts_per_step=2", "algorithm.group_size=2",
                      "worker.rollout.num_inference_steps=4", "trainer.total_steps=3",
                      "trainer.save_dir=" + dir_.path() + "/run"});
    return TrainConfig::Load("", overrides).value();
  }

  absl::StatusOr<std::unique_ptr<FlowGrpoTrainer>> Start(const TrainConfig& config) {
    FlowGrpoTrainer::Options options;
    options.start_workers = FakeTrainingWorkers::Starter(state_);
    return FlowGrpoTrainer::Start(config, std::move(options));
  }

  int Count(const std::string& call) const {
    return static_cast<int>(std::count(state_->calls.begin(), state_->calls.end(), call));
  }

  int MetricsLines() const {
    const std::string text = ReadFile(dir_.path() + "/run/metrics.jsonl").value();
    return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
  }

  ScratchDir dir_ = ScratchDir::Create("trainer-loop").value();
  std::shared_ptr<FakeTrainingWorkers::State> state_ =
      std::make_shared<FakeTrainingWorkers::State>();
};

TEST_F(TrainerLoopTest, EachGrpoStepRollsOutThenUpdatesWithAdvantages) {
  DRAY_ASSERT_OK_AND_ASSIGN(auto trainer, Start(Config({})));
  DRAY_ASSERT_OK(trainer->Run());
  EXPECT_EQ(Count("rollout"), 3);
  EXPECT_EQ(Count("update_actor"), 3);
  EXPECT_THAT(state_->calls, Contains(absl::StrCat("save ", dir_.path(), "/run/final")));
  ASSERT_EQ(state_->updates.size(), 3u);
  for (const DataProto& update : state_->updates) {
    EXPECT_EQ(update.size(), 4);
    EXPECT_TRUE(update.GetTensor(kAdvantagesColumn).ok());
    EXPECT_TRUE(update.GetMeta<double>(kLearningRateKey).ok());
  }
  EXPECT_EQ(MetricsLines(), 3);
  EXPECT_TRUE(fs::exists(dir_.path() + "/run/curves.png"));
  EXPECT_TRUE(fs::exists(dir_.path() + "/run/samples/step_0.png"));
}

// The trajectories stay on the ranks: an update names each row by its place
// in its rank's share of the rollout, shuffled within that share only.
TEST_F(TrainerLoopTest, UpdatesNameTheRowsOfEachRanksRollout) {
  state_->world_size = 2;
  DRAY_ASSERT_OK_AND_ASSIGN(auto trainer, Start(Config({"trainer.total_steps=1"})));
  DRAY_ASSERT_OK(trainer->Run());
  ASSERT_EQ(state_->updates.size(), 1u);
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor rows, state_->updates[0].GetTensor(kRolloutRowColumn));
  ASSERT_EQ(rows.size(0), 4);
  for (int rank = 0; rank < 2; ++rank) {
    const at::Tensor share = std::get<0>(rows.slice(0, 2 * rank, 2 * rank + 2).sort());
    EXPECT_TRUE(at::equal(share, at::arange(2, at::kLong))) << "rank " << rank;
  }
  EXPECT_FALSE(state_->updates[0].HasColumn(kImagesColumn)) << "nothing of the rows travels";
}

TEST_F(TrainerLoopTest, SftStepsUpdateOnPairsAndDrawSamples) {
  DRAY_ASSERT_OK_AND_ASSIGN(auto trainer, Start(Config({"algorithm.name=sft"})));
  DRAY_ASSERT_OK(trainer->Run());
  EXPECT_EQ(Count("sft_update"), 3);
  EXPECT_EQ(Count("rollout"), 0);
  EXPECT_GE(Count("edit"), 1) << "the sample grid";
  EXPECT_EQ(MetricsLines(), 3);
}

TEST_F(TrainerLoopTest, VaeStepsUpdateTheVaeAndDrawReconstructions) {
  DRAY_ASSERT_OK_AND_ASSIGN(auto trainer, Start(Config({"algorithm.name=vae"})));
  DRAY_ASSERT_OK(trainer->Run());
  EXPECT_EQ(Count("vae_update"), 3);
  EXPECT_GE(Count("reconstruct"), 1) << "the sample grid";
  EXPECT_THAT(ReadFile(dir_.path() + "/run/metrics.jsonl").value(),
              HasSubstr("\"reconstruction_rmse\""));
}

TEST_F(TrainerLoopTest, AFailedWorkerRestartsTheGroupFromTheNewestCheckpoint) {
  state_->fail_update_call = 3;  // step 2's update
  DRAY_ASSERT_OK_AND_ASSIGN(auto trainer,
                            Start(Config({"trainer.save_every=1", "trainer.max_restarts=1"})));
  DRAY_ASSERT_OK(trainer->Run());
  EXPECT_EQ(trainer->restarts(), 1);
  EXPECT_EQ(state_->started, 2);
  EXPECT_THAT(state_->calls, Contains(absl::StrCat("load_checkpoint ", dir_.path(),
                                                   "/run/checkpoints/step_000002")));
  EXPECT_EQ(Count("update_actor"), 4) << "step 2 once more";
  EXPECT_EQ(MetricsLines(), 3);
}

TEST_F(TrainerLoopTest, WithoutRestartsLeftAFailedStepEndsTheRunNamingIt) {
  state_->fail_update_call = 2;
  DRAY_ASSERT_OK_AND_ASSIGN(auto trainer, Start(Config({})));
  EXPECT_THAT(trainer->Run(),
              testing::StatusIs(absl::StatusCode::kUnavailable, HasSubstr("step 1: rank 0 died")));
}

TEST_F(TrainerLoopTest, OnNanSkipSkipsTheStepsUpdateAndGoesOn) {
  state_->fail_update_call = 2;
  state_->update_failure = absl::DataLossError("the loss is not finite");
  DRAY_ASSERT_OK_AND_ASSIGN(auto trainer, Start(Config({"trainer.on_nan=skip"})));
  DRAY_ASSERT_OK(trainer->Run());
  EXPECT_EQ(MetricsLines(), 3);
  const std::string metrics = ReadFile(dir_.path() + "/run/metrics.jsonl").value();
  EXPECT_THAT(metrics, HasSubstr("\"skipped\""));
}

TEST_F(TrainerLoopTest, AResumedRunLoadsTheCheckpointAndDoesOnlyTheStepsLeft) {
  {
    DRAY_ASSERT_OK_AND_ASSIGN(auto trainer,
                              Start(Config({"trainer.save_every=1", "trainer.total_steps=2"})));
    DRAY_ASSERT_OK(trainer->Run());
  }
  state_->calls.clear();
  DRAY_ASSERT_OK_AND_ASSIGN(auto trainer,
                            Start(Config({"trainer.save_every=1", "trainer.resume=auto"})));
  DRAY_ASSERT_OK(trainer->Run());
  EXPECT_EQ(state_->calls.front(),
            absl::StrCat("load_checkpoint ", dir_.path(), "/run/checkpoints/step_000002"));
  EXPECT_EQ(Count("rollout"), 1) << "step 2 alone";
  EXPECT_EQ(MetricsLines(), 3);
}

}  // namespace
}  // namespace dray
