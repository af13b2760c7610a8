#include "workers/parity/flux_kontext_parity.h"

#include <ATen/ATen.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/io/safetensors.h"
#include "workers/models/clip/text_encoder.h"
#include "workers/models/clip/tokenizer.h"
#include "workers/models/component_weights.h"
#include "workers/models/flux/kontext_helpers.h"
#include "workers/models/flux/kontext_pipeline.h"
#include "workers/models/flux/model.h"
#include "workers/models/flux/transformer.h"
#include "workers/models/flux/vae.h"
#include "workers/models/image_resize.h"
#include "workers/models/layers.h"
#include "workers/models/model_index.h"
#include "workers/models/pixels.h"
#include "workers/models/qwen_image/pipeline_helpers.h"
#include "workers/models/qwen_image/scheduler.h"
#include "workers/models/t5/encoder.h"
#include "workers/models/t5/tokenizer.h"

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

// kTextTolerance: the README's atol for the text encoders.
constexpr double kTextTolerance = 5e-5;

absl::StatusOr<std::vector<ParityResult>> RunTextEncoders(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(auto file, CaseFile(c));
  const at::TensorOptions options = at::TensorOptions().dtype(at::kFloat);
  DRAY_ASSIGN_OR_RETURN(clip::ClipTextModel clip,
                        clip::LoadClipTextModel((ModelDir(c) / "text_encoder").string(), options));
  DRAY_ASSIGN_OR_RETURN(t5::T5Encoder t5,
                        t5::LoadT5Encoder((ModelDir(c) / "text_encoder_2").string(), options));
  at::NoGradGuard no_grad;
  DRAY_ASSIGN_OR_RETURN(at::Tensor clip_ids, file->Get("clip_input_ids"));
  DRAY_ASSIGN_OR_RETURN(at::Tensor t5_ids, file->Get("t5_input_ids"));
  DRAY_ASSIGN_OR_RETURN(clip::ClipTextOutput clip_out, clip->forward(clip_ids));
  DRAY_ASSIGN_OR_RETURN(at::Tensor t5_out, t5->forward(t5_ids));
  std::vector<ParityResult> results;
  for (const auto& [name, actual] :
       {std::pair{"clip_last_hidden_state", clip_out.last_hidden_state},
        {"clip_pooler_output", clip_out.pooler_output},
        {"t5_last_hidden_state", t5_out}}) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor expected, file->Get(name));
    results.push_back(CompareTensors(c, name, actual, expected, kTextTolerance, 0));
  }
  return results;
}

// Ids: a JSON list of token ids as an int64 tensor.
at::Tensor Ids(const json& ids) { return at::tensor(ids.get<std::vector<int64_t>>(), at::kLong); }

absl::StatusOr<std::vector<ParityResult>> RunTokenizers(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(json cases, ReadJsonFile((fs::path(c.folder) / "cases.json").string()));
  DRAY_ASSIGN_OR_RETURN(clip::Tokenizer clip,
                        clip::Tokenizer::FromDirectory((ModelDir(c) / "tokenizer").string()));
  DRAY_ASSIGN_OR_RETURN(t5::Tokenizer t5,
                        t5::Tokenizer::FromDirectory((ModelDir(c) / "tokenizer_2").string()));
  std::vector<ParityResult> results;
  int index = 0;
  for (const json& entry : cases.at("cases")) {
    const std::string prompt = entry.at("prompt");
    const std::string name = absl::StrCat("prompt", index++, ".");
    DRAY_ASSIGN_OR_RETURN(std::vector<int64_t> clip_77, clip.Encode(prompt, 77));
    results.push_back(CompareTensors(c, name + "clip_ids_max_length_77",
                                     at::tensor(clip_77, at::kLong),
                                     Ids(entry.at("clip_ids_max_length_77")), 0, 0));
    results.push_back(CompareTensors(c, name + "clip_ids_longest",
                                     at::tensor(clip.EncodeUnpadded(prompt), at::kLong),
                                     Ids(entry.at("clip_ids_longest")), 0, 0));
    for (int64_t length : {32, 512}) {
      DRAY_ASSIGN_OR_RETURN(std::vector<int64_t> ids, t5.Encode(prompt, length));
      const std::string key = absl::StrCat("t5_ids_max_length_", length);
      results.push_back(
          CompareTensors(c, name + key, at::tensor(ids, at::kLong), Ids(entry.at(key)), 0, 0));
    }
    results.push_back(CompareTensors(c, name + "t5_ids_longest",
                                     at::tensor(t5.EncodeUnpadded(prompt), at::kLong),
                                     Ids(entry.at("t5_ids_longest")), 0, 0));
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

// Meta: a case file's metadata entry `key`, parsed as JSON.
absl::StatusOr<json> Meta(const SafetensorsFile& file, const std::string& key) {
  auto it = file.metadata().find(key);
  if (it == file.metadata().end())
    return absl::NotFoundError(absl::StrCat(file.path(), " has no metadata '", key, "'"));
  json parsed = json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded())
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": metadata '", key, "' is not JSON"));
  return parsed;
}

// EndToEnd compares one pipeline run's every recorded stage with the case.
class EndToEnd {
 public:
  EndToEnd(const ParityCase& c, std::shared_ptr<const SafetensorsFile> file)
      : case_(c), file_(std::move(file)) {}

  // Compare records `actual` against the case's tensor `name`.
  void Compare(const std::string& name, const at::Tensor& actual, double atol = kModelTolerance) {
    absl::StatusOr<at::Tensor> expected = file_->Get(name);
    if (!expected.ok()) {
      ParityResult missing{case_.component, case_.name, name};
      missing.error = std::string(expected.status().message());
      results_.push_back(missing);
      return;
    }
    results_.push_back(
        CompareTensors(case_, name, actual.to(expected->scalar_type()), *expected, atol, 0));
  }

  absl::Status Run(FluxKontextPipeline& pipeline);
  std::vector<ParityResult> results() && { return std::move(results_); }

 private:
  absl::StatusOr<KontextOptions> Options(const json& call) const;
  // Side encodes `prompt` as the pipeline does and compares it with the
  // case's `side` ("prompt" or "negative").
  absl::StatusOr<TextConditioning> Side(FluxKontextPipeline& pipeline, const std::string& side,
                                        const std::string& prompt, int64_t max_sequence_length);

  const ParityCase& case_;
  std::shared_ptr<const SafetensorsFile> file_;
  std::vector<ParityResult> results_;
};

absl::StatusOr<KontextOptions> EndToEnd::Options(const json& call) const {
  KontextOptions options;
  options.num_inference_steps = call.at("num_inference_steps");
  options.guidance_scale = call.at("guidance_scale");
  options.width = call.at("width").get<int64_t>();
  options.height = call.at("height").get<int64_t>();
  options.max_area = call.at("max_area");
  options.auto_resize = call.at("_auto_resize");
  options.max_sequence_length = call.at("max_sequence_length");
  if (call.contains("negative_prompt")) {
    options.negative_prompt = call.at("negative_prompt").get<std::string>();
    options.true_cfg_scale = call.at("true_cfg_scale");
  }
  return options;
}

absl::StatusOr<TextConditioning> EndToEnd::Side(FluxKontextPipeline& pipeline,
                                                const std::string& side, const std::string& prompt,
                                                int64_t max_sequence_length) {
  FluxKontextModel& model = pipeline.model();
  DRAY_ASSIGN_OR_RETURN(std::vector<int64_t> clip_ids, model.clip_tokenizer->Encode(prompt, 77));
  DRAY_ASSIGN_OR_RETURN(std::vector<int64_t> t5_ids,
                        model.t5_tokenizer->Encode(prompt, max_sequence_length));
  Compare(side + ".clip_input_ids", at::tensor(clip_ids, at::kLong).unsqueeze(0), 0);
  Compare(side + ".t5_input_ids", at::tensor(t5_ids, at::kLong).unsqueeze(0), 0);
  DRAY_ASSIGN_OR_RETURN(TextConditioning text,
                        pipeline.EncodePrompts({prompt}, max_sequence_length));
  Compare(side + ".prompt_embeds", text.embeds);
  Compare(side + ".pooled_prompt_embeds", text.pooled);
  return text;
}

absl::Status EndToEnd::Run(FluxKontextPipeline& pipeline) {
  DRAY_ASSIGN_OR_RETURN(json call, Meta(*file_, "call"));
  DRAY_ASSIGN_OR_RETURN(json seed, Meta(*file_, "case_seed"));
  DRAY_ASSIGN_OR_RETURN(KontextOptions options, Options(call));
  DRAY_ASSIGN_OR_RETURN(at::Tensor image, file_->Get("image_uint8_hwc"));
  DRAY_ASSIGN_OR_RETURN(
      KontextSizes sizes,
      ComputeKontextSizes(image.size(1), image.size(0), options, pipeline.vae_scale_factor()));
  DRAY_ASSIGN_OR_RETURN(at::Tensor resized, ResizeImage(image, sizes.image_height,
                                                        sizes.image_width, Resample::kLanczos));
  const at::Tensor pixels = ImagesToPixels({resized}, at::kFloat);
  Compare("vae_encode_input", pixels);
  at::NoGradGuard no_grad;
  DRAY_ASSIGN_OR_RETURN(
      PreparedKontextEdit prepared,
      pipeline.PrepareLatents({seed.get<uint64_t>()}, pixels, sizes.height, sizes.width));
  DRAY_ASSIGN_OR_RETURN(prepared.prompt,
                        Side(pipeline, "prompt", call.at("prompt"), options.max_sequence_length));
  if (options.negative_prompt.has_value()) {
    DRAY_ASSIGN_OR_RETURN(prepared.negative, Side(pipeline, "negative", *options.negative_prompt,
                                                  options.max_sequence_length));
  }
  prepared.txt_ids = at::zeros({prepared.prompt.embeds.size(1), 3}, at::kFloat);
  Compare("latents_initial", prepared.noise);
  Compare("image_latents", prepared.image_latents);
  Compare("img_ids", prepared.img_ids, 0);
  Compare("txt_ids", prepared.txt_ids, 0);
  DRAY_ASSIGN_OR_RETURN(qwen_image::FlowMatchEulerScheduler scheduler,
                        pipeline.Scheduler(prepared.noise.size(1), options.num_inference_steps));
  at::Tensor latents = prepared.noise;
  for (int i = 0; i < options.num_inference_steps; ++i) {
    const std::string step = absl::StrCat("step", i, ".");
    const at::Tensor timestep = scheduler.timesteps()[i].expand({1});
    Compare(step + "timestep_input", timestep / 1000);
    for (const auto& [name, text] :
         {std::pair{"noise_pred_cond", &prepared.prompt},
          {"noise_pred_uncond", prepared.negative ? &*prepared.negative : nullptr}}) {
      if (text == nullptr) continue;
      DRAY_ASSIGN_OR_RETURN(
          at::Tensor prediction,
          pipeline.Prediction(prepared, *text, latents, timestep, options.guidance_scale));
      Compare(step + name, prediction);
    }
    DRAY_ASSIGN_OR_RETURN(at::Tensor velocity,
                          pipeline.Velocity(prepared, latents, timestep, options.guidance_scale,
                                            options.true_cfg_scale));
    DRAY_ASSIGN_OR_RETURN(latents, scheduler.Step(velocity, latents));
    Compare(step + "latents", latents);
  }
  Compare("latents_final", latents);
  DRAY_ASSIGN_OR_RETURN(
      at::Tensor unpacked,
      qwen_image::UnpackLatents(latents, sizes.height, sizes.width, pipeline.vae_scale_factor()));
  Compare("vae_decode_input", pipeline.model().vae->Denormalize(unpacked.select(2, 0)));
  DRAY_ASSIGN_OR_RETURN(at::Tensor decoded,
                        pipeline.DecodeLatents(latents, sizes.height, sizes.width));
  Compare("image_np", (decoded / 2 + 0.5).clamp(0, 1).permute({0, 2, 3, 1}));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ParityResult>> RunEndToEnd(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(auto file, CaseFile(c));
  DRAY_ASSIGN_OR_RETURN(
      FluxKontextModel model,
      LoadFluxKontextModel(ModelDir(c).string(), at::TensorOptions().dtype(at::kFloat)));
  FluxKontextPipeline pipeline(std::move(model));
  EndToEnd run(c, file);
  DRAY_RETURN_IF_ERROR(run.Run(pipeline));
  return std::move(run).results();
}

}  // namespace

std::vector<ParityCase> FluxKontextParityCases(const std::string& dir) {
  const fs::path folder(dir);
  if (ModelPipelineClass(dir) != kFluxKontextPipeline) return {};
  const std::string name = folder.filename().string();
  if (name == "transformer") return CaseFilesIn("flux_transformer", dir, RunTransformer);
  if (name == "vae") return CaseFilesIn("flux_vae", dir, RunVae);
  if (name == "e2e") return CaseFilesIn("flux_kontext_e2e", dir, RunEndToEnd);
  if (name == "text_encoders") return CaseFilesIn("flux_text_encoders", dir, RunTextEncoders);
  std::error_code error;
  if (!fs::exists(folder / "cases.json", error)) return {};
  if (name == "scheduler") return {{"flux_scheduler", dir, "schedules", RunSchedules}};
  if (name == "preprocess") return {{"flux_preprocess", dir, "sizes", RunPreprocessSizes}};
  if (name == "tokenizers") return {{"flux_tokenizers", dir, "prompts", RunTokenizers}};
  return {};
}

}  // namespace dray::flux
