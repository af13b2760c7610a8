#include "workers/train/synthetic_edit_score.h"

#include <ATen/ATen.h>

#include <torch/csrc/autograd/grad_mode.h>

#include "base/status_macros.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/pipeline/edit_config.h"
#include "workers/train/train_data.h"

namespace dray {
namespace {

at::Tensor MeanColour(const at::Tensor& image) {
  return image.to(at::kFloat).reshape({-1, 3}).mean(0);
}

double Distance(const at::Tensor& a, const at::Tensor& b) { return (a - b).norm().item<double>(); }

}  // namespace

absl::StatusOr<std::vector<SyntheticEditScore>> ScoreSyntheticEdits(
    qwen_image::QwenImageEditPipeline& pipeline, const HeldOutScenes& scenes) {
  ImageEditConfig config;
  config.UseEmbeddedDefaults();
  DRAY_ASSIGN_OR_RETURN(qwen_image::EditOptions options, EditOptionsFor(config, {}));
  torch::NoGradGuard no_grad;
  std::vector<SyntheticEditScore> scores;
  for (const std::string& instruction : SyntheticEditInstructions()) {
    std::vector<qwen_image::EditInput> inputs;
    for (int64_t seed = 0; seed < scenes.count; ++seed) {
      inputs.push_back({{SyntheticScene(seed, scenes.height, scenes.width)},
                        instruction,
                        static_cast<uint64_t>(seed)});
    }
    DRAY_ASSIGN_OR_RETURN(std::vector<at::Tensor> edited, pipeline.Edit(inputs, options));
    double before = 0, after = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      DRAY_ASSIGN_OR_RETURN(at::Tensor target, ApplyEdit(inputs[i].images[0], instruction));
      before += Distance(MeanColour(inputs[i].images[0]), MeanColour(target));
      after += Distance(MeanColour(edited[i]), MeanColour(target));
    }
    scores.push_back({instruction, after / before, std::move(edited)});
  }
  return scores;
}

}  // namespace dray
