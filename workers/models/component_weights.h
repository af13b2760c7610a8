// One component folder of a diffusers or transformers model directory
// (`transformer/`, `vae/`, `text_encoder/`): its weights opened as those
// libraries look for them, and its config and weights written as their
// save_pretrained writes them (dray init-model).
//
//   DRAY_ASSIGN_OR_RETURN(Checkpoint weights, OpenComponentWeights(root + "/vae"));
#ifndef DRAY_WORKERS_MODELS_COMPONENT_WEIGHTS_H_
#define DRAY_WORKERS_MODELS_COMPONENT_WEIGHTS_H_

#include <string>

#include <torch/nn/module.h>

#include "absl/status/statusor.h"
#include "runtime/io/safetensors.h"

namespace dray {

// OpenComponentWeights: the one `*.safetensors.index.json` (sharded
// weights), else `diffusion_pytorch_model.safetensors` or
// `model.safetensors`. NOT_FOUND when the folder holds none of these,
// INVALID_ARGUMENT when it holds several indexes, or a file that is not
// valid safetensors.
absl::StatusOr<Checkpoint> OpenComponentWeights(const std::string& dir);

// WriteComponentConfig writes `json` (a config.json's text) and a newline.
absl::Status WriteComponentConfig(const std::string& path, const std::string& json);

// WriteComponentWeights writes `module`'s parameters to `path` as one
// safetensors file with save_pretrained's metadata ({"format": "pt"}).
absl::Status WriteComponentWeights(const std::string& path, torch::nn::Module& module);

}  // namespace dray

#endif  // DRAY_WORKERS_MODELS_COMPONENT_WEIGHTS_H_
