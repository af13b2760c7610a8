// OpenComponentWeights opens the weights of one component folder of a
// diffusers or transformers model directory (`transformer/`, `vae/`,
// `text_encoder/`), looking for them as those libraries do: the one
// `*.safetensors.index.json` (sharded weights), else
// `diffusion_pytorch_model.safetensors` or `model.safetensors`.
//
//   DRAY_ASSIGN_OR_RETURN(Checkpoint weights, OpenComponentWeights(root + "/vae"));
//
// Errors: NOT_FOUND when the folder holds none of these, INVALID_ARGUMENT
// when it holds several indexes, or a file that is not valid safetensors.
#ifndef DRAY_WORKERS_MODELS_COMPONENT_WEIGHTS_H_
#define DRAY_WORKERS_MODELS_COMPONENT_WEIGHTS_H_

#include <string>

#include "absl/status/statusor.h"
#include "runtime/io/safetensors.h"

namespace dray {

absl::StatusOr<Checkpoint> OpenComponentWeights(const std::string& dir);

}  // namespace dray

#endif  // DRAY_WORKERS_MODELS_COMPONENT_WEIGHTS_H_
