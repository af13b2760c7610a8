#include "workers/parity/flux_kontext_parity.h"

#include <ATen/ATen.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/io/safetensors.h"
#include "workers/models/component_weights.h"
#include "workers/models/flux/kontext_helpers.h"
#include "workers/models/flux/transformer.h"
#include "workers/models/flux/vae.h"
#include "workers/models/layers.h"
#include "workers/models/qwen_image/scheduler.h"

namespace dray::flux {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The README's tolerances: model outputs, latents and images (atol);
// timesteps and sigmas (relative).
constexpr double kModelTolerance = 1e-4;
constexpr double kScheduleTolerance = 1e-6;

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

absl::StatusOr<std::vector<ParityResult>> RunVae(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(auto file, CaseFile(c));
  const std::string dir = (ModelDir(c) / "vae").string();
  DRAY_ASSIGN_OR_RETURN(AutoencoderKLConfig config,
                        AutoencoderKLConfig::FromFile(dir + "/config.json"));
  AutoencoderKL vae(config, at::TensorOptions().dtype(at::kFloat));
  DRAY_ASSIGN_OR_RETURN(Checkpoint weights, OpenComponentWeights(dir));
  DRAY_RETURN_IF_ERROR(LoadStateDict(*vae, weights));
  at::NoGradGuard no_grad;
  DRAY_ASSIGN_OR_RETURN(at::Tensor input, file->Get("vae_input"));
  DRAY_ASSIGN_OR_RETURN(GaussianLatents latents, vae->Encode(input));
  const at::Tensor scaled = vae->Normalize(latents.mean);
  DRAY_ASSIGN_OR_RETURN(at::Tensor decoded, vae->Decode(vae->Denormalize(scaled)));
  std::vector<ParityResult> results;
  for (const auto& [name, actual] : {std::pair{"latent_mean", latents.mean},
                                     {"latent_logvar", latents.logvar},
                                     {"image_latents_scaled", scaled},
                                     {"decoded", decoded}}) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor expected, file->Get(name));
    results.push_back(CompareTensors(c, name, actual, expected, kModelTolerance, 0));
  }
  return results;
}

// Floats: a JSON list of numbers as a float64 tensor.
at::Tensor Floats(const json& values) {
  return at::tensor(values.get<std::vector<double>>(), at::kDouble);
}

absl::StatusOr<std::vector<ParityResult>> RunSchedules(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(json cases, ReadJsonFile((fs::path(c.folder) / "cases.json").string()));
  DRAY_ASSIGN_OR_RETURN(qwen_image::FlowMatchEulerConfig config,
                        qwen_image::FlowMatchEulerConfig::FromFile(
                            (ModelDir(c) / "scheduler" / "scheduler_config.json").string()));
  std::vector<ParityResult> results;
  for (const json& schedule : cases.at("cases")) {
    const std::string name =
        absl::StrCat("seq", schedule.at("image_seq_len").get<int64_t>(), "_steps",
                     schedule.at("num_inference_steps").get<int>(), ".");
    const int steps = schedule.at("num_inference_steps");
    const double mu = qwen_image::CalculateShift(
        schedule.at("image_seq_len").get<int64_t>(), config.base_image_seq_len,
        config.max_image_seq_len, config.base_shift, config.max_shift);
    results.push_back(CompareTensors(c, name + "mu", at::tensor({mu}, at::kDouble),
                                     Floats(json::array({schedule.at("mu")})), 1e-12, 0));
    qwen_image::FlowMatchEulerScheduler scheduler(config);
    DRAY_RETURN_IF_ERROR(scheduler.SetSigmas(qwen_image::Linspace(1.0, 1.0 / steps, steps), mu));
    results.push_back(CompareTensors(c, name + "timesteps", scheduler.timesteps().to(at::kDouble),
                                     Floats(schedule.at("timesteps_f32")), 0, kScheduleTolerance));
    results.push_back(CompareTensors(c, name + "sigmas", scheduler.sigmas().to(at::kDouble),
                                     Floats(schedule.at("sigmas_f32")), 0, kScheduleTolerance));
    const json& step = schedule.at("euler_step0");
    const std::vector<int64_t> shape = step.at("shape").get<std::vector<int64_t>>();
    DRAY_ASSIGN_OR_RETURN(at::Tensor previous,
                          scheduler.Step(Floats(step.at("model_output")).to(at::kFloat).view(shape),
                                         Floats(step.at("sample")).to(at::kFloat).view(shape)));
    results.push_back(CompareTensors(c, name + "euler_step0", previous.to(at::kDouble).flatten(),
                                     Floats(step.at("prev_sample")), kModelTolerance, 0));
  }
  return results;
}

// RunPreprocessSizes: the output size and the condition image's size at the
// pipeline's real defaults (max_area 1024^2, auto_resize). (The case images themselves are not
// stored, so the resized pixels are checked by the e2e cases instead.)
absl::StatusOr<std::vector<ParityResult>> RunPreprocessSizes(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(json cases, ReadJsonFile((fs::path(c.folder) / "cases.json").string()));
  // The tiny model's VAE scale (4), at the real sizes' max_area.
  DRAY_ASSIGN_OR_RETURN(
      AutoencoderKLConfig vae,
      AutoencoderKLConfig::FromFile((ModelDir(c) / "vae" / "config.json").string()));
  std::vector<ParityResult> results;
  for (const json& entry : cases.at("cases")) {
    const json& call = entry.at("call");
    KontextOptions options;
    if (call.contains("width")) options.width = call.at("width").get<int64_t>();
    if (call.contains("height")) options.height = call.at("height").get<int64_t>();
    if (call.contains("max_area")) options.max_area = call.at("max_area").get<int64_t>();
    if (call.contains("_auto_resize")) options.auto_resize = call.at("_auto_resize").get<bool>();
    const std::vector<int64_t> input = entry.at("input_wh").get<std::vector<int64_t>>();
    DRAY_ASSIGN_OR_RETURN(KontextSizes sizes, ComputeKontextSizes(input[0], input[1], options,
                                                                  vae.spatial_compression()));
    const std::vector<int64_t> shape =
        entry.at("condition_tensor_shape").get<std::vector<int64_t>>();
    const at::Tensor actual =
        at::tensor({sizes.height, sizes.width, sizes.image_height, sizes.image_width}, at::kLong);
    const at::Tensor expected =
        at::tensor({entry.at("output_height").get<int64_t>(),
                    entry.at("output_width").get<int64_t>(), shape[2], shape[3]},
                   at::kLong);
    results.push_back(
        CompareTensors(c, entry.at("case").get<std::string>() + ".sizes", actual, expected, 0, 0));
  }
  return results;
}

}  // namespace

std::vector<ParityCase> FluxKontextParityCases(const std::string& dir) {
  const fs::path folder(dir);
  if (ModelPipelineClass(dir) != "FluxKontextPipeline") return {};
  const std::string name = folder.filename().string();
  if (name == "transformer") return CaseFilesIn("flux_transformer", dir, RunTransformer);
  if (name == "vae") return CaseFilesIn("flux_vae", dir, RunVae);
  std::error_code error;
  if (!fs::exists(folder / "cases.json", error)) return {};
  if (name == "scheduler") return {{"flux_scheduler", dir, "schedules", RunSchedules}};
  if (name == "preprocess") return {{"flux_preprocess", dir, "sizes", RunPreprocessSizes}};
  return {};
}

}  // namespace dray::flux
