// The embedded model that every command without a model path runs (trained
// by tools/train_embedded_model.sh): on synthetic scenes it never saw, with
// the options `dray edit` gives it, each edit it was trained for (the
// two-picture "give picture 1 the sky of picture 2" too) moves the output's
// mean colour toward the mean colour of what the edit should give,
// on square and on wide scenes (docs/training.md, "The embedded model", has the shares
// measured when it was trained). A random model fails most of them.
#include "workers/models/qwen_image/embedded_model.h"

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "workers/models/qwen_image/edit_pipeline.h"
#include "workers/models/qwen_image/model.h"
#include "workers/train/synthetic_edit_score.h"

namespace dray {
namespace {

// ExpectEditsMoveTheMeanColour checks every instruction on `scenes`: no
// more than `most_remaining` of the distance may remain.
void ExpectEditsMoveTheMeanColour(const HeldOutScenes& scenes, double most_remaining) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/embedded";
  DRAY_ASSERT_OK(qwen_image::WriteEmbeddedModel(dir));
  DRAY_ASSERT_OK_AND_ASSIGN(qwen_image::QwenImageModel model,
                            qwen_image::LoadQwenImageModel(dir, at::TensorOptions(at::kFloat)));
  qwen_image::QwenImageEditPipeline pipeline(std::move(model));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<SyntheticEditScore> scores,
                            ScoreSyntheticEdits(pipeline, scenes));
  for (const SyntheticEditScore& score : scores) {
    std::cout << scenes.height << "x" << scenes.width << " '" << score.instruction
              << "': " << score.remaining
              << " of the mean colour's distance to the target remains\n";
    EXPECT_LT(score.remaining, most_remaining) << "'" << score.instruction << "'";
  }
}

TEST(EmbeddedModelTest, EditsMoveTheMeanColourTowardTheEditsTargetOnSquareScenes) {
  ExpectEditsMoveTheMeanColour(HeldOutScenes{4, 64, 64}, 0.5);
}

TEST(EmbeddedModelTest, EditsMoveTheMeanColourTowardTheEditsTargetOnWideScenes) {
  ExpectEditsMoveTheMeanColour(HeldOutScenes{4, 48, 80}, 0.6);
}

}  // namespace
}  // namespace dray
