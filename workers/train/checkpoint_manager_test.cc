#include "workers/train/checkpoint_manager.h"

#include <filesystem>
#include <string>
#include <vector>

#include "base/files.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dray {
namespace {

namespace fs = std::filesystem;
using ::dray::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;

class CheckpointManagerTest : public ::testing::Test {
 protected:
  TrainConfig Config(const std::string& resume = "never", int64_t keep_last = 2) const {
    TrainConfig config;
    config.save_dir = dir_.path();
    config.resume = resume;
    config.keep_last = keep_last;
    return config;
  }

  // SaveSteps saves a checkpoint after each of `steps`, its shard file
  // naming the step.
  static void SaveSteps(CheckpointManager& checkpoints, const std::vector<int64_t>& steps) {
    for (int64_t step : steps) {
      DRAY_ASSERT_OK(checkpoints.Save(step, {{"history", nlohmann::json::array()}},
                                      [step](const std::string& dir) {
                                        return WriteFile(dir + "/shard", std::to_string(step));
                                      }));
    }
  }

  ScratchDir dir_ = ScratchDir::Create("checkpoints").value();
};

std::vector<std::string> Names(const std::vector<std::string>& paths) {
  std::vector<std::string> names;
  for (const std::string& path : paths) names.push_back(fs::path(path).filename().string());
  return names;
}

TEST_F(CheckpointManagerTest, ASaveIsCompleteWithItsShardsAndState) {
  CheckpointManager checkpoints(Config());
  SaveSteps(checkpoints, {3});
  const std::string step = checkpoints.root() + "/step_000003";
  EXPECT_EQ(checkpoints.NewestComplete(), step);
  EXPECT_EQ(ReadFile(step + "/shard").value(), "3");
  DRAY_ASSERT_OK_AND_ASSIGN(nlohmann::json state, CheckpointManager::ReadState(step));
  EXPECT_TRUE(state["history"].is_array());
}

TEST_F(CheckpointManagerTest, AFailedSaveLeavesNoCheckpointAndItsRemainsGoAtTheNextStart) {
  CheckpointManager checkpoints(Config());
  const absl::Status failed =
      checkpoints.Save(1, {{"history", nlohmann::json::array()}},
                       [](const std::string&) { return absl::UnavailableError("a worker died"); });
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(checkpoints.Complete().empty());
  EXPECT_TRUE(fs::exists(checkpoints.root() + "/.step_000001.partial"));
  checkpoints.RemovePartial();
  EXPECT_TRUE(fs::is_empty(checkpoints.root()));
}

TEST_F(CheckpointManagerTest, KeepsTheNewestKeepLast) {
  CheckpointManager checkpoints(Config("never", /*keep_last=*/2));
  SaveSteps(checkpoints, {1, 2, 10});
  EXPECT_THAT(Names(checkpoints.Complete()), ElementsAre("step_000002", "step_000010"));
}

TEST_F(CheckpointManagerTest, ASavedStepIsNotSavedAgain) {
  CheckpointManager checkpoints(Config());
  SaveSteps(checkpoints, {4});
  DRAY_ASSERT_OK(
      checkpoints.Save(4, {{"history", nlohmann::json::array()}}, [](const std::string&) {
        ADD_FAILURE() << "saved again";
        return absl::OkStatus();
      }));
}

TEST_F(CheckpointManagerTest, ResumeNeverStartsAfreshButNotOverAnEarlierRun) {
  CheckpointManager empty(Config("never"));
  DRAY_ASSERT_OK_AND_ASSIGN(std::optional<std::string> none, empty.ToResume());
  EXPECT_FALSE(none.has_value());
  SaveSteps(empty, {1});
  EXPECT_THAT(CheckpointManager(Config("never")).ToResume().status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("holds checkpoints of an earlier run")));
}

TEST_F(CheckpointManagerTest, ResumeAutoTakesTheNewestCompleteOne) {
  CheckpointManager checkpoints(Config("auto", /*keep_last=*/5));
  DRAY_ASSERT_OK_AND_ASSIGN(std::optional<std::string> first, checkpoints.ToResume());
  EXPECT_FALSE(first.has_value()) << "a first run";
  SaveSteps(checkpoints, {2, 6});
  fs::create_directories(checkpoints.root() + "/step_000009");  // no state: incomplete
  DRAY_ASSERT_OK_AND_ASSIGN(std::optional<std::string> resumed, checkpoints.ToResume());
  ASSERT_TRUE(resumed.has_value());
  EXPECT_THAT(*resumed, EndsWith("step_000006"));
}

TEST_F(CheckpointManagerTest, ResumeFromAFolderMustBeACompleteCheckpoint) {
  CheckpointManager saver(Config());
  SaveSteps(saver, {5});
  const std::string step = saver.root() + "/step_000005";
  DRAY_ASSERT_OK_AND_ASSIGN(std::optional<std::string> resumed,
                            CheckpointManager(Config(step)).ToResume());
  EXPECT_EQ(resumed, step);
  EXPECT_THAT(CheckpointManager(Config(dir_.path() + "/nowhere")).ToResume().status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("is not a directory")));
  EXPECT_THAT(CheckpointManager(Config(dir_.path())).ToResume().status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("is not a complete checkpoint")));
}

TEST_F(CheckpointManagerTest, LaterCheckpointsAreSetAsideNotDeleted) {
  CheckpointManager checkpoints(Config("auto", /*keep_last=*/5));
  SaveSteps(checkpoints, {2, 4, 6});
  DRAY_ASSERT_OK(checkpoints.SetAsideLaterThan(checkpoints.root() + "/step_000002"));
  EXPECT_THAT(Names(checkpoints.Complete()), ElementsAre("step_000002"));
  EXPECT_TRUE(fs::exists(checkpoints.root() + "/abandoned_after_step_2/step_000004/shard"));
  EXPECT_TRUE(fs::exists(checkpoints.root() + "/abandoned_after_step_2/step_000006/shard"));
}

TEST_F(CheckpointManagerTest, AStateWithoutHistoryIsDataLoss) {
  fs::create_directories(dir_.path() + "/bad");
  DRAY_ASSERT_OK(WriteFile(dir_.path() + "/bad/" + kTrainerStateFile, "{\"step\": 1}"));
  EXPECT_THAT(CheckpointManager::ReadState(dir_.path() + "/bad").status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("is not a trainer state")));
}

}  // namespace
}  // namespace dray
