// Training an Edit-Plus model (Qwen-Image-Edit-2509/2511) on rows of two
// pictures: {"images": [...], "instruction", "target"} for SFT and
// {"images": [...], "instruction"} for Flow-GRPO, through the same trainer,
// workers and checkpoints as one-image rows.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/train/train_test_util.h"
#include "workers/image/image_codec.h"
#include "workers/models/qwen_image/model.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/train/train_data.h"

namespace dray {
namespace {

namespace fs = std::filesystem;
using ::dray::testing::StatusIs;
using ::testing::HasSubstr;

// PlusModel: a random tiny Edit-Plus model directory, written once.
const std::string& PlusModel() {
  static const std::string dir = [] {
    const std::string path = SaveDir("tiny_plus_model");
    qwen_image::ModelPreset preset = qwen_image::PresetNamed("tiny").value();
    preset.pipeline = qwen_image::EditPipelineKind::kEditPlus;
    EXPECT_TRUE(qwen_image::WriteRandomQwenImageModel(path, preset, /*seed=*/0).ok());
    return path;
  }();
  return dir;
}

// TwoPictureRows writes four rows of two synthetic scenes each (the second
// smaller and wide), with the first scene's edit as SFT's target.
std::string TwoPictureRows(const std::string& dir) {
  fs::create_directories(dir);
  std::string jsonl;
  for (int i = 0; i < 4; ++i) {
    const std::string first = absl::StrCat("scene_", i, ".png");
    const std::string second = absl::StrCat("sky_", i, ".png");
    const std::string target = absl::StrCat("target_", i, ".png");
    const at::Tensor scene = SyntheticScene(i, 64, 64);
    EXPECT_TRUE(WritePngFile(dir + "/" + first, scene).ok());
    EXPECT_TRUE(WritePngFile(dir + "/" + second, SyntheticScene(10 + i, 32, 64)).ok());
    EXPECT_TRUE(
        WritePngFile(dir + "/" + target, ApplyEdit(scene, "turn the sky red").value()).ok());
    absl::StrAppend(&jsonl,
                    nlohmann::json{{"images", {first, second}},
                                   {"instruction", "give picture 1 the sky of picture 2"},
                                   {"target", target},
                                   {"target_color", "red"}}
                        .dump(),
                    "\n");
  }
  EXPECT_TRUE(WriteFile(dir + "/train.jsonl", jsonl).ok());
  return dir + "/train.jsonl";
}

// PlusJob: a small job on the rows above; `overrides` come last, so they win.
TrainConfig PlusJob(const std::string& dir, const std::vector<std::string>& overrides) {
  std::vector<std::string> all = {
      "worker.image_edit.model_path=" + PlusModel(),
      "data.train_files=" + TwoPictureRows(dir + "/data"), "worker.rollout.resolution=64",
      "worker.image_edit.condition_image_size=56", "trainer.sample_every=1"};
  // GRPO resizes the inputs to about image_size^2; sft's pairs are about
  // resolution^2 pixels, and it refuses the key it does not read.
  if (std::find(overrides.begin(), overrides.end(), "algorithm.name=sft") == overrides.end())
    all.push_back("worker.image_edit.image_size=64");
  all.insert(all.end(), overrides.begin(), overrides.end());
  return SmallJob(dir + "/run", all);
}

TEST(EditPlusTrainingTest, RowsOfTwoPicturesReachTheWorkers) {
  const std::string dir = SaveDir("plus_rows");
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<TrainPrompt> prompts,
                            ReadTrainPrompts(TwoPictureRows(dir), RowKind::kTarget));
  ASSERT_EQ(prompts.size(), 4u);
  EXPECT_EQ(prompts[0].pictures().size(), 2u);
  EXPECT_NE(prompts[0].group(), prompts[1].group());
  DRAY_ASSERT_OK_AND_ASSIGN(auto trainer, StartTrainer(PlusJob(dir, {}), 1));
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto rows, trainer->RolloutBatch(0));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<EditRow> decoded, DecodeEditRows(rows, 0));
  for (const EditRow& row : decoded) {
    ASSERT_EQ(row.images.size(), 2u);
    EXPECT_EQ(row.images[1].size(0), 32);
  }
}

TEST(EditPlusTrainingTest, SftAndGrpoTrainOnTwoPictureRows) {
  for (const std::string algorithm : {"sft", "grpo"}) {
    SCOPED_TRACE(algorithm);
    const std::string dir = SaveDir("plus_" + algorithm);
    DRAY_ASSERT_OK_AND_ASSIGN(
        auto trainer,
        StartTrainer(
            PlusJob(dir, {"algorithm.name=" + algorithm, "worker.reward.functions=[color]"}), 1));
    DRAY_ASSERT_OK(trainer->Run());
    const std::string metrics = ReadFile(dir + "/run/metrics.jsonl").value();
    EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 2);
    EXPECT_THAT(metrics, ::testing::Not(HasSubstr("nan")));
    EXPECT_TRUE(fs::exists(dir + "/run/final/pytorch_lora_weights.safetensors"));
  }
}

// The pictures the text encoder sees follow worker.image_edit.condition_image_size
// in training as in serving: the first SFT loss differs with it.
TEST(EditPlusTrainingTest, TheConditionImageSizeReachesTheWorkers) {
  std::vector<double> first_losses;
  for (const std::string size : {"56", "112"}) {
    const std::string dir = SaveDir("plus_condition_" + size);
    DRAY_ASSERT_OK_AND_ASSIGN(
        auto trainer, StartTrainer(PlusJob(dir, {"algorithm.name=sft", "trainer.total_steps=1",
                                                 "worker.image_edit.condition_image_size=" + size}),
                                   1));
    DRAY_ASSERT_OK(trainer->Run());
    const std::string metrics = ReadFile(dir + "/run/metrics.jsonl").value();
    first_losses.push_back(
        nlohmann::json::parse(metrics.substr(0, metrics.find('\n'))).at("loss").get<double>());
  }
  EXPECT_NE(first_losses[0], first_losses[1]);
}

TEST(EditPlusTrainingTest, BadImagesListsNameTheLine) {
  const std::string dir = SaveDir("plus_bad");
  fs::create_directories(dir);
  ASSERT_TRUE(WriteFile(dir + "/train.jsonl",
                        R"({"images": ["a.png", "b.png", "c.png", "d.png"], "instruction": "x"})"
                        "\n")
                  .ok());
  EXPECT_THAT(ReadTrainPrompts(dir + "/train.jsonl"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(":1: \"images\" must be a list of 1 to 3 paths")));
}

}  // namespace
}  // namespace dray
