#include "workers/parity/flux_kontext_parity.h"

#include <ATen/ATen.h>

#include <filesystem>

#include "base/status_macros.h"
#include "runtime/io/safetensors.h"
#include "workers/models/component_weights.h"
#include "workers/models/flux/transformer.h"
#include "workers/models/layers.h"

namespace dray::flux {
namespace {

namespace fs = std::filesystem;

// kModelTolerance: the README's atol for model outputs, latents and images.
constexpr double kModelTolerance = 1e-4;

fs::path ModelDir(const ParityCase& c) { return fs::path(c.folder).parent_path() / "model"; }

absl::StatusOr<std::shared_ptr<const SafetensorsFile>> CaseFile(const ParityCase& c) {
  return SafetensorsFile::Open((fs::path(c.folder) / (c.name + ".safetensors")).string());
}

absl::StatusOr<FluxTransformer> LoadTransformer(const fs::path& model_dir) {
  const std::string dir = (model_dir / "transformer").string();
  DRAY_ASSIGN_OR_RETURN(FluxTransformerConfig config,
                        FluxTransformerConfig::FromFile(dir + "/config.json"));
  FluxTransformer model(config, at::TensorOptions().dtype(at::kFloat));
  DRAY_ASSIGN_OR_RETURN(Checkpoint weights, OpenComponentWeights(dir));
  DRAY_RETURN_IF_ERROR(LoadStateDict(*model, weights));
  return model;
}

absl::StatusOr<std::vector<ParityResult>> RunTransformer(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(auto file, CaseFile(c));
  DRAY_ASSIGN_OR_RETURN(FluxTransformer model, LoadTransformer(ModelDir(c)));
  FluxTransformerInputs inputs;
  for (const auto& [name, tensor] : {std::pair{"hidden_states", &inputs.hidden_states},
                                     {"encoder_hidden_states", &inputs.encoder_hidden_states},
                                     {"pooled_projections", &inputs.pooled_projections},
                                     {"timestep", &inputs.timestep},
                                     {"guidance", &inputs.guidance},
                                     {"img_ids", &inputs.img_ids},
                                     {"txt_ids", &inputs.txt_ids}}) {
    DRAY_ASSIGN_OR_RETURN(*tensor, file->Get(name));
  }
  at::NoGradGuard no_grad;
  DRAY_ASSIGN_OR_RETURN(at::Tensor sample, model->forward(inputs));
  DRAY_ASSIGN_OR_RETURN(at::Tensor expected, file->Get("sample"));
  return std::vector<ParityResult>{
      CompareTensors(c, "sample", sample, expected, kModelTolerance, 0)};
}

}  // namespace

std::vector<ParityCase> FluxKontextParityCases(const std::string& dir) {
  const fs::path folder(dir);
  if (ModelPipelineClass(dir) != "FluxKontextPipeline") return {};
  const std::string name = folder.filename().string();
  if (name == "transformer") return CaseFilesIn("flux_transformer", dir, RunTransformer);
  return {};
}

}  // namespace dray::flux
