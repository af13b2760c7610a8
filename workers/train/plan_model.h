// LoadPlanModel counts a model for the memory plan (workers/train/memory_plan.h):
// the transformer and the frozen models beside it are built shape-only on
// the meta device (a model directory through its loader's
// Weights::kShapeOnly path, which reads only the configs and builds under
// DeferredAllocation), LoRA adapters are attached as training attaches
// them (AddLoraAdapters), and every parameter is counted by block: exact
// for any size, nothing typed in by hand.
//
//   DRAY_ASSIGN_OR_RETURN(PlanModel kontext, LoadPlanModel("flux-real", {/*rank=*/32}));
//   DRAY_ASSIGN_OR_RETURN(PlanModel mine, LoadPlanModel("/models/FLUX.1-Kontext-dev", {}));
//
// Thread-safety: thread-compatible (builds its own modules).
#ifndef DRAY_WORKERS_TRAIN_PLAN_MODEL_H_
#define DRAY_WORKERS_TRAIN_PLAN_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "workers/models/flux/transformer.h"
#include "workers/train/memory_plan.h"

namespace dray {

// LoraPlan: LoRA on the transformer, or full fine-tuning (rank 0).
struct LoraPlan {
  int64_t rank = 0;
  // Layers adapted (peft's matching); empty: the family's default,
  // flux::DiffusersLoraTargets() or TrainConfig's lora_target_modules for Qwen-Image.
  std::vector<std::string> target_modules;
};

// kPlanPresets: the preset names LoadPlanModel knows, as errors list them.
inline constexpr char kPlanPresets[] = "flux-real, flux-tiny, real, small, embedded, tiny";

// LoadPlanModel counts `model`: a preset (kPlanPresets: FLUX.1 Kontext's and
// Qwen-Image-Edit's, workers/models/*/model.h) or a diffusers model
// directory of either family. NOT_FOUND when it is neither; a target
// module that matches no layer is INVALID_ARGUMENT naming it.
absl::StatusOr<PlanModel> LoadPlanModel(const std::string& model, const LoraPlan& lora);

// CountFluxTransformer counts a FLUX.1 transformer as built (adapters, if
// any, attached; on any device), without frozen models beside it: for
// checking the plan against a model actually trained (dray bench --suite plan).
PlanModel CountFluxTransformer(const std::string& name,
                               const flux::FluxTransformerImpl& transformer);

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_PLAN_MODEL_H_
