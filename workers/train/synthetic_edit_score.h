// How well a model makes the synthetic edits of train_data.h on scenes it
// never saw (the training set's scenes have seeds from 1000): the check of
// the embedded model (tests/train/embedded_model_test.cc) and of a model
// being trained for it (`embedded_model score`, tools/).
//
//   ASSIGN_OR_RETURN(auto scores, ScoreSyntheticEdits(pipeline, {4, 48, 80}));
//   for (const SyntheticEditScore& s : scores) ... s.remaining < 0.75 ...
#ifndef DRAY_WORKERS_TRAIN_SYNTHETIC_EDIT_SCORE_H_
#define DRAY_WORKERS_TRAIN_SYNTHETIC_EDIT_SCORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "workers/models/qwen_image/edit_pipeline.h"

namespace dray {

// HeldOutScenes: scenes with seeds 0 .. count-1, drawn at height x width;
// the two-picture edit's picture 2 of scene s is SkyDonorScene(kFirstSkyDonor + s).
struct HeldOutScenes {
  static constexpr int64_t kFirstSkyDonor = 500;
  int64_t count = 4;
  int64_t height = 64;
  int64_t width = 64;
};

// SyntheticEditScore: for one instruction, the share of the distance from
// each scene's mean colour to its exact edit's mean colour that remains in
// the model's output, summed over the scenes (0: the exact edit's mean
// colour; 1: no closer than the scene itself).
struct SyntheticEditScore {
  std::string instruction;
  double remaining = 0;
  std::vector<at::Tensor> edited;  // the model's output for each scene, uint8 [H, W, 3]
};

// ScoreSyntheticEdits edits `scenes` by every synthetic instruction (and,
// for an Edit-Plus model, the two-picture sky edit, last) with the options
// `dray edit` gives the embedded model (each scene's noise seeded by its
// own seed), denoising with `step_cache` (default: exact) in `steps`
// steps (0: the embedded model's), guided by the negative prompt " " at
// `guidance` when above 1, and scores them.
absl::StatusOr<std::vector<SyntheticEditScore>> ScoreSyntheticEdits(
    qwen_image::QwenImageEditPipeline& pipeline, const HeldOutScenes& scenes = {},
    const qwen_image::StepCacheOptions& step_cache = {}, int steps = 0, double guidance = 1);

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_SYNTHETIC_EDIT_SCORE_H_
