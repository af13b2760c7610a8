#include "tests/models/reference_transformer.h"

#include "base/status_macros.h"
#include "tests/models/reference.h"
#include "workers/models/component_weights.h"
#include "workers/models/layers.h"

namespace dray {

absl::StatusOr<qwen_image::QwenImageTransformer> LoadReferenceTransformer(const std::string& folder,
                                                                          bool zero_cond_t) {
  DRAY_ASSIGN_OR_RETURN(
      qwen_image::TransformerConfig config,
      qwen_image::TransformerConfig::FromFile(ReferencePath(folder + "/config.json")));
  config.zero_cond_t = zero_cond_t;
  qwen_image::QwenImageTransformer model(config, at::TensorOptions().dtype(at::kFloat));
  DRAY_ASSIGN_OR_RETURN(Checkpoint weights, OpenComponentWeights(ReferencePath(folder)));
  DRAY_RETURN_IF_ERROR(LoadStateDict(*model, weights));
  return model;
}

}  // namespace dray
