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
    qwen_image::QwenImageEditPipeline& pipeline, const HeldOutScenes& scenes,
    const qwen_image::StepCacheOptions& step_cache, int steps, double guidance) {
  ImageEditConfig config;
  config.UseEmbeddedDefaults();
  DRAY_ASSIGN_OR_RETURN(qwen_image::EditOptions options, EditOptionsFor(config, {}));
  options.step_cache = step_cache;
  if (steps > 0) options.num_inference_steps = steps;
  if (guidance > 1) {
    options.negative_prompt = " ";
    options.true_cfg_scale = guidance;
  }
  torch::NoGradGuard no_grad;
  // score edits `inputs` (one per scene) and compares them with `targets`.
  auto score = [&](const std::string& instruction, const std::vector<qwen_image::EditInput>& inputs,
                   const std::vector<at::Tensor>& targets) -> absl::StatusOr<SyntheticEditScore> {
    DRAY_ASSIGN_OR_RETURN(std::vector<at::Tensor> edited, pipeline.Edit(inputs, options));
    double before = 0, after = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      before += Distance(MeanColour(inputs[i].images[0]), MeanColour(targets[i]));
      after += Distance(MeanColour(edited[i]), MeanColour(targets[i]));
    }
    return SyntheticEditScore{instruction, after / before, std::move(edited)};
  };
  std::vector<SyntheticEditScore> scores;
  for (const std::string& instruction : SyntheticEditInstructions()) {
    std::vector<qwen_image::EditInput> inputs;
    std::vector<at::Tensor> targets;
    for (int64_t seed = 0; seed < scenes.count; ++seed) {
      at::Tensor scene = SyntheticScene(seed, scenes.height, scenes.width);
      DRAY_ASSIGN_OR_RETURN(targets.emplace_back(), ApplyEdit(scene, instruction));
      inputs.push_back({{std::move(scene)}, instruction, static_cast<uint64_t>(seed)});
    }
    DRAY_ASSIGN_OR_RETURN(scores.emplace_back(), score(instruction, inputs, targets));
  }
  if (pipeline.model().pipeline != qwen_image::EditPipelineKind::kEditPlus) return scores;
  std::vector<qwen_image::EditInput> inputs;
  std::vector<at::Tensor> targets;
  for (int64_t seed = 0; seed < scenes.count; ++seed) {
    const int64_t donor = HeldOutScenes::kFirstSkyDonor + seed;
    inputs.push_back({{SyntheticScene(seed, scenes.height, scenes.width),
                       SkyDonorScene(donor, scenes.height, scenes.width)},
                      kSkyTransferInstruction,
                      static_cast<uint64_t>(seed)});
    targets.push_back(SceneWithSkyOf(seed, donor, scenes.height, scenes.width));
  }
  DRAY_ASSIGN_OR_RETURN(scores.emplace_back(), score(kSkyTransferInstruction, inputs, targets));
  return scores;
}

}  // namespace dray
