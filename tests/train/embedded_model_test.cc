// The embedded model that every command without a model path runs (trained
// by tools/train_embedded_model.sh): on synthetic scenes it never saw, with
// the options `dray edit` gives it, each edit it was trained for moves the
// output's mean colour toward the mean colour of what the edit should give,
// by at least a quarter of the way (measured when it was trained: purple
// 0.35, red 0.49, blue 0.45, green 0.10, darker 0.62, brighter 0.07, sky
// red 0.25, sky orange 0.43 of the distance remain). A random model (the
// old embedded default) fails most of them.
#include "workers/models/qwen_image/embedded_model.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <torch/csrc/autograd/grad_mode.h>

#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "workers/edit/edit_batch.h"
#include "workers/edit/edit_config.h"
#include "workers/models/qwen_image/edit_pipeline.h"
#include "workers/models/qwen_image/model.h"
#include "workers/train/train_data.h"

namespace dray {
namespace {

// kHeldOutScenes: scene seeds the training set (seeds from 1000) does not hold.
constexpr int64_t kHeldOutScenes = 4;

at::Tensor MeanColour(const at::Tensor& image) {
  return image.to(at::kFloat).reshape({-1, 3}).mean(0);
}

double Distance(const at::Tensor& a, const at::Tensor& b) { return (a - b).norm().item<double>(); }

TEST(EmbeddedModelTest, EditsMoveTheMeanColourTowardTheEditsTarget) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/embedded";
  DRAY_ASSERT_OK(qwen_image::WriteEmbeddedModel(dir));
  DRAY_ASSERT_OK_AND_ASSIGN(qwen_image::QwenImageModel model,
                            qwen_image::LoadQwenImageModel(dir, at::TensorOptions(at::kFloat)));
  qwen_image::QwenImageEditPipeline pipeline(std::move(model));
  ImageEditConfig config;
  config.UseEmbeddedDefaults();
  DRAY_ASSERT_OK_AND_ASSIGN(qwen_image::EditOptions options, EditOptionsFor(config, {}));
  torch::NoGradGuard no_grad;
  for (const std::string& instruction : SyntheticEditInstructions()) {
    std::vector<qwen_image::EditInput> inputs;
    for (int64_t seed = 0; seed < kHeldOutScenes; ++seed)
      inputs.push_back({SyntheticScene(seed, 64), instruction, seed});
    DRAY_ASSERT_OK_AND_ASSIGN(std::vector<at::Tensor> edited, pipeline.Edit(inputs, options));
    double before = 0, after = 0;
    for (int64_t i = 0; i < kHeldOutScenes; ++i) {
      DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor target, ApplyEdit(inputs[i].image, instruction));
      before += Distance(MeanColour(inputs[i].image), MeanColour(target));
      after += Distance(MeanColour(edited[i]), MeanColour(target));
    }
    std::cout << "'" << instruction << "': " << after / before
              << " of the mean colour's distance to the target remains\n";
    EXPECT_LT(after, 0.75 * before)
        << "'" << instruction << "': the mean colour is " << after / kHeldOutScenes
        << " from the target's after the edit, " << before / kHeldOutScenes << " before";
  }
}

}  // namespace
}  // namespace dray
