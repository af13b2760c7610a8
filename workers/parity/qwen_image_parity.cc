#include "workers/parity/qwen_image_parity.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <regex>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "runtime/io/safetensors.h"
#include "workers/models/component_weights.h"
#include "workers/models/layers.h"
#include "workers/models/qwen_image/pipeline_helpers.h"
#include "workers/models/qwen_image/scheduler.h"
#include "workers/models/qwen_image/transformer.h"
#include "workers/models/qwen_image/vae.h"
#include "workers/parity/parity_case.h"

namespace dray::qwen_image {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kModelTolerance = 1e-5;
constexpr double kSigmaTolerance = 1e-7;
constexpr double kTimestepTolerance = 1e-4;
constexpr double kStepTolerance = 1e-6;

// JsonTensor reads {"shape": [...], "data": [...]} as float32.
at::Tensor JsonTensor(const json& stored) {
  std::vector<float> data = stored.at("data").get<std::vector<float>>();
  return at::tensor(data, at::kFloat).reshape(stored.at("shape").get<std::vector<int64_t>>());
}

absl::StatusOr<json> ReadJson(const fs::path& path) { return ReadJsonFile(path.string()); }

absl::StatusOr<std::vector<ParityResult>> RunSchedule(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(json cases, ReadJson(fs::path(c.folder) / "cases.json"));
  DRAY_ASSIGN_OR_RETURN(
      FlowMatchEulerConfig config,
      FlowMatchEulerConfig::FromFile((fs::path(c.folder) / "scheduler_config.json").string()));
  const json& schedule = cases.at("schedules").at(std::stoi(c.name.substr(c.name.find('_') + 1)));
  const int steps = schedule.at("num_inference_steps");
  const auto args = schedule.at("calculate_shift_args").get<std::vector<double>>();
  const double mu = CalculateShift(static_cast<int64_t>(args[0]), static_cast<int64_t>(args[1]),
                                   static_cast<int64_t>(args[2]), args[3], args[4]);
  std::vector<ParityResult> results;
  results.push_back(CompareTensors(c, "mu", at::tensor({mu}, at::kDouble),
                                   at::tensor({schedule.at("mu").get<double>()}, at::kDouble), 0,
                                   0));
  FlowMatchEulerScheduler scheduler(config);
  const json& pipeline = schedule.at("pipeline");
  DRAY_RETURN_IF_ERROR(scheduler.SetSigmas(Linspace(1.0, 1.0 / steps, steps), mu));
  results.push_back(CompareTensors(c, "pipeline.sigmas", scheduler.sigmas(),
                                   JsonTensor(pipeline.at("sigmas")), kSigmaTolerance, 0));
  results.push_back(CompareTensors(c, "pipeline.timesteps", scheduler.timesteps(),
                                   JsonTensor(pipeline.at("timesteps")), kTimestepTolerance, 0));
  DRAY_RETURN_IF_ERROR(scheduler.SetTimesteps(steps, mu));
  const json& own = schedule.at("set_timesteps_default");
  results.push_back(CompareTensors(c, "default.sigmas", scheduler.sigmas(),
                                   JsonTensor(own.at("sigmas")), kSigmaTolerance, 0));
  results.push_back(CompareTensors(c, "default.timesteps", scheduler.timesteps(),
                                   JsonTensor(own.at("timesteps")), kTimestepTolerance, 0));
  return results;
}

absl::StatusOr<std::vector<ParityResult>> RunSteps(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(json cases, ReadJson(fs::path(c.folder) / "cases.json"));
  DRAY_ASSIGN_OR_RETURN(
      FlowMatchEulerConfig config,
      FlowMatchEulerConfig::FromFile((fs::path(c.folder) / "scheduler_config.json").string()));
  const json& steps = cases.at("step_cases");
  const int n = steps.at(0).at("num_inference_steps");
  FlowMatchEulerScheduler scheduler(config);
  DRAY_RETURN_IF_ERROR(
      scheduler.SetSigmas(Linspace(1.0, 1.0 / n, n), steps.at(0).at("mu").get<double>()));
  std::vector<ParityResult> results;
  for (const json& step : steps) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor previous, scheduler.Step(JsonTensor(step.at("model_output")),
                                                              JsonTensor(step.at("sample"))));
    results.push_back(
        CompareTensors(c, absl::StrCat("step_", step.at("i").get<int>(), ".prev_sample"), previous,
                       JsonTensor(step.at("prev_sample")), kStepTolerance, 0));
  }
  return results;
}

absl::StatusOr<std::vector<ParityResult>> RunHelpers(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(json cases, ReadJson(fs::path(c.folder) / "cases.json"));
  std::vector<double> widths, expected_widths, mus, expected_mus;
  for (const json& d : cases.at("calculate_dimensions")) {
    const auto [width, height] =
        CalculateDimensions(d.at("target_area").get<double>(), d.at("ratio").get<double>());
    widths.insert(widths.end(), {static_cast<double>(width), static_cast<double>(height)});
    expected_widths.insert(expected_widths.end(),
                           {d.at("width").get<double>(), d.at("height").get<double>()});
  }
  for (const json& s : cases.at("calculate_shift")) {
    std::vector<double> args = s.at("args").get<std::vector<double>>();
    if (s.contains("defaults")) {
      for (double d : s.at("defaults").get<std::vector<double>>()) args.push_back(d);
    }
    mus.push_back(CalculateShift(static_cast<int64_t>(args[0]), static_cast<int64_t>(args[1]),
                                 static_cast<int64_t>(args[2]), args[3], args[4]));
    expected_mus.push_back(s.at("mu").get<double>());
  }
  std::vector<ParityResult> results = {
      CompareTensors(c, "calculate_dimensions", at::tensor(widths, at::kDouble),
                     at::tensor(expected_widths, at::kDouble), 0, 0),
      CompareTensors(c, "calculate_shift", at::tensor(mus, at::kDouble),
                     at::tensor(expected_mus, at::kDouble), 0, 0)};
  DRAY_ASSIGN_OR_RETURN(
      auto file, SafetensorsFile::Open((fs::path(c.folder) / "pack_unpack.safetensors").string()));
  const std::regex unpack_args(R"(height=(\d+), width=(\d+), vae_scale_factor=(\d+))");
  for (const auto& [name, entry] : cases.at("pack_unpack").items()) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor input, file->Get(name + ".input"));
    DRAY_ASSIGN_OR_RETURN(at::Tensor expected, file->Get(name + ".output"));
    const std::string call = entry.at("call");
    std::smatch match;
    absl::StatusOr<at::Tensor> output =
        name.rfind("pack", 0) == 0 ? PackLatents(input)
        : std::regex_search(call, match, unpack_args)
            ? UnpackLatents(input, std::stoll(match[1]), std::stoll(match[2]), std::stoll(match[3]))
            : absl::InvalidArgumentError(absl::StrCat("cannot read the arguments of ", call));
    DRAY_RETURN_IF_ERROR(output.status());
    results.push_back(CompareTensors(c, name, *output, expected, 0, 0));
  }
  return results;
}

absl::StatusOr<std::vector<SampleImages>> ImageShapes(const std::string& text) {
  const json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_array())
    return absl::InvalidArgumentError("img_shapes is not a JSON list");
  std::vector<SampleImages> shapes;
  for (const json& sample : parsed) {
    SampleImages images;
    for (const json& image : sample) images.push_back(image.get<ImageShape>());
    shapes.push_back(images);
  }
  return shapes;
}

absl::StatusOr<std::string> Meta(const SafetensorsFile& file, const std::string& key) {
  auto it = file.metadata().find(key);
  if (it == file.metadata().end())
    return absl::NotFoundError(absl::StrCat(file.path(), " has no metadata '", key, "'"));
  return it->second;
}

absl::StatusOr<std::vector<ParityResult>> RunTransformer(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(
      auto file, SafetensorsFile::Open((fs::path(c.folder) / (c.name + ".safetensors")).string()));
  DRAY_ASSIGN_OR_RETURN(json config, ReadJson(fs::path(c.folder) / "config.json"));
  const std::string overrides = Meta(*file, "config_overrides").value_or("{}");
  config.merge_patch(json::parse(overrides, nullptr, /*allow_exceptions=*/false));
  DRAY_ASSIGN_OR_RETURN(JsonConfig json_config,
                        JsonConfig::Parse(config.dump(), c.folder + "/config.json"));
  DRAY_ASSIGN_OR_RETURN(TransformerConfig parsed,
                        TransformerConfig::FromJson(std::move(json_config)));
  QwenImageTransformer model(parsed, at::TensorOptions().dtype(at::kFloat));
  DRAY_ASSIGN_OR_RETURN(Checkpoint weights, OpenComponentWeights(c.folder));
  DRAY_RETURN_IF_ERROR(LoadStateDict(*model, weights));
  DRAY_ASSIGN_OR_RETURN(std::string shapes_text, Meta(*file, "img_shapes"));
  DRAY_ASSIGN_OR_RETURN(std::vector<SampleImages> shapes, ImageShapes(shapes_text));
  const at::Tensor mask = file->contains("encoder_hidden_states_mask")
                              ? file->Get("encoder_hidden_states_mask").value()
                              : at::Tensor();
  DRAY_ASSIGN_OR_RETURN(at::Tensor hidden, file->Get("hidden_states"));
  DRAY_ASSIGN_OR_RETURN(at::Tensor text, file->Get("encoder_hidden_states"));
  DRAY_ASSIGN_OR_RETURN(at::Tensor timestep, file->Get("timestep"));
  DRAY_ASSIGN_OR_RETURN(at::Tensor sample, model->forward(hidden, text, mask, timestep, shapes));
  DRAY_ASSIGN_OR_RETURN(at::Tensor expected, file->Get("sample"));
  std::vector<ParityResult> results = {
      CompareTensors(c, "sample", sample, expected, kModelTolerance, kModelTolerance)};
  if (file->contains(
          "noise_pred_unpacked")) {  // what the pipeline keeps: the noisy tokens, unpacked
    DRAY_ASSIGN_OR_RETURN(std::string noisy, Meta(*file, "noisy_seq_len"));
    DRAY_ASSIGN_OR_RETURN(std::string hw_text, Meta(*file, "pixel_hw_noisy"));
    DRAY_ASSIGN_OR_RETURN(std::string vae_scale, Meta(*file, "vae_scale_factor"));
    const auto hw = json::parse(hw_text).get<std::vector<int64_t>>();
    DRAY_ASSIGN_OR_RETURN(at::Tensor unpacked,
                          UnpackLatents(sample.slice(1, 0, std::stoll(noisy)), hw.at(0), hw.at(1),
                                        std::stoll(vae_scale)));
    results.push_back(CompareTensors(c, "noise_pred_unpacked", unpacked,
                                     file->Get("noise_pred_unpacked").value(), kModelTolerance,
                                     kModelTolerance));
  }
  return results;
}

absl::StatusOr<std::vector<ParityResult>> RunVae(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(
      auto file, SafetensorsFile::Open((fs::path(c.folder) / (c.name + ".safetensors")).string()));
  DRAY_ASSIGN_OR_RETURN(VaeConfig config,
                        VaeConfig::FromFile((fs::path(c.folder) / "config.json").string()));
  AutoencoderKLQwenImage vae(config, at::TensorOptions().dtype(at::kFloat));
  DRAY_ASSIGN_OR_RETURN(Checkpoint weights, OpenComponentWeights(c.folder));
  DRAY_RETURN_IF_ERROR(LoadStateDict(*vae, weights));
  std::vector<std::pair<std::string, at::Tensor>> outputs;
  if (file->contains("z")) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor sample, vae->Decode(file->Get("z").value()));
    outputs.emplace_back("sample", sample);
  } else {
    DRAY_ASSIGN_OR_RETURN(at::Tensor x, file->Get("x"));
    DRAY_ASSIGN_OR_RETURN(LatentDistribution dist, vae->Encode(x));
    if (file->contains("sample")) {
      DRAY_ASSIGN_OR_RETURN(at::Tensor sample, vae->Decode(dist.mean));
      outputs.emplace_back("sample", sample);
    }
    if (file->contains("image_latents"))
      outputs.emplace_back("image_latents", vae->Normalize(dist.mean));
    if (file->contains("latent_dist.mean")) {
      outputs.insert(outputs.end(), {{"latent_dist.parameters", dist.parameters},
                                     {"latent_dist.mean", dist.mean},
                                     {"latent_dist.logvar", dist.logvar},
                                     {"latent_dist.std", dist.std},
                                     {"latent_dist.var", dist.var},
                                     {"latent_dist.mode", dist.mean}});
    }
  }
  std::vector<ParityResult> results;
  for (const auto& [name, actual] : outputs) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor expected, file->Get(name));
    results.push_back(CompareTensors(c, name, actual, expected, kModelTolerance, kModelTolerance));
  }
  return results;
}

}  // namespace

std::vector<ParityCase> QwenImageParityCases(const std::string& dir) {
  const fs::path folder(dir);
  const std::string component = folder.filename().string();
  std::vector<ParityCase> cases;
  if (fs::exists(folder / "scheduler_config.json") && fs::exists(folder / "cases.json")) {
    const absl::StatusOr<json> all = ReadJson(folder / "cases.json");
    const size_t schedules =
        all.ok() && all->contains("schedules") ? (*all)["schedules"].size() : 0;
    for (size_t i = 0; i < schedules; ++i) {
      cases.push_back({component, folder.string(), absl::StrCat("schedule_", i), RunSchedule});
    }
    cases.push_back({component, folder.string(), "steps", RunSteps});
    return cases;
  }
  if (fs::exists(folder / "pack_unpack.safetensors") && fs::exists(folder / "cases.json")) {
    return {{component, folder.string(), "helpers", RunHelpers}};
  }
  const absl::StatusOr<json> config = ReadJson(folder / "config.json");
  if (!config.ok() || !config->is_object() || !config->contains("_class_name")) return cases;
  const std::string class_name =
      (*config)["_class_name"].is_string() ? (*config)["_class_name"].get<std::string>() : "";
  ParityRun run;
  if (class_name == "QwenImageTransformer2DModel") {
    run = RunTransformer;
  } else if (class_name == "AutoencoderKLQwenImage") {
    run = RunVae;
  } else {
    return cases;
  }
  return CaseFilesIn(component, folder.string(), run);
}

}  // namespace dray::qwen_image
