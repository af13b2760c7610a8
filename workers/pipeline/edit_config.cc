#include "workers/pipeline/edit_config.h"

#include "absl/strings/str_cat.h"
#include "base/cpu_bfloat16.h"
#include "base/status_macros.h"
#include "runtime/sharding/strategy.h"
#include "workers/config/yaml_config.h"

namespace dray {

absl::Status ImageEditConfig::Validate() const {
  const ImageEditConfig& c = *this;
  auto bad = [](const char* key, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(kConfigSection, ".", key, " ", why));
  };
  if (c.batch_size < 1) return bad("batch_size", "must be at least 1");
  if (c.image_size < 16 || c.image_size > 4096) return bad("image_size", "must lie in [16, 4096]");
  if (c.condition_image_size < 16 || c.condition_image_size > 4096)
    return bad("condition_image_size", "must lie in [16, 4096]");
  if (c.max_pixels < 256 || c.max_pixels > kMaxOutputPixels)
    return bad("max_pixels", absl::StrCat("must lie in [256, ", kMaxOutputPixels, "]"));
  if (c.image_size * c.image_size > c.max_pixels) {
    return bad("image_size", absl::StrCat("^2 = ", c.image_size * c.image_size,
                                          " exceeds max_pixels = ", c.max_pixels));
  }
  if (c.max_prompt_tokens < 1 || c.max_prompt_tokens > kMaxPromptTokens)
    return bad("max_prompt_tokens", absl::StrCat("must lie in [1, ", kMaxPromptTokens, "]"));
  if (c.num_inference_steps < 1) return bad("num_inference_steps", "must be at least 1");
  if (!(c.true_cfg_scale >= 0)) return bad("true_cfg_scale", "must be >= 0");
  if (!(c.guidance_scale >= 0 && c.guidance_scale <= 100))
    return bad("guidance_scale", "must lie in [0, 100]");
  if (c.seed < 0) return bad("seed", "must be >= 0");
  if (c.torch_dtype != "float32" && c.torch_dtype != "bfloat16" && c.torch_dtype != "float16" &&
      c.torch_dtype != "float64") {
    return bad("torch_dtype", absl::StrCat("'", c.torch_dtype,
                                           "' is not one of float32, bfloat16, float16, float64"));
  }
  if (c.device != "cpu" && c.device != "cuda") {  // a worker sees only its own GPU
    return bad("device", absl::StrCat("'", c.device, "' is not cpu or cuda"));
  }
  if (c.device == "cpu" && c.torch_dtype == "float16") {  // LibTorch 1.13 has no CPU float16 matmul
    return bad("torch_dtype", "float16 needs device cuda; on cpu use float32 or bfloat16");
  }
  if (c.device == "cpu" && c.torch_dtype == "bfloat16") {
    if (absl::Status bf16 = CpuBfloat16Support(); !bf16.ok()) {
      return bad("torch_dtype", absl::StrCat("bfloat16 cannot run on cpu here: ", bf16.message(),
                                             "; use float32 or device cuda"));
    }
  }
  if (c.cfg_parallel_size != 1 && c.cfg_parallel_size != 2)
    return bad("cfg_parallel_size", "must be 1 or 2 (the prompt's and the negative prompt's pass)");
  if (c.ulysses_degree < 1 || c.ulysses_degree > 64)
    return bad("ulysses_degree", "must lie in [1, 64]");
  if (!(c.step_cache_threshold >= 0 && c.step_cache_threshold <= 10))
    return bad("step_cache_threshold", "must lie in [0, 10]");
  if (c.step_cache_threshold > 0 && c.enable_fsdp) {
    return bad("step_cache_threshold",
               "must be 0 with enable_fsdp: a cached step skips blocks, which sharded ranks "
               "gather together");
  }
  if (c.step_cache_warmup_steps < 0) return bad("step_cache_warmup_steps", "must be >= 0");
  absl::StatusOr<ShardingStrategy> strategy = ParseShardingStrategy(c.fsdp_sharding_strategy);
  if (!strategy.ok())
    return bad("fsdp_sharding_strategy", std::string(strategy.status().message()));
  return absl::OkStatus();
}

std::vector<ConfigKey> ImageEditConfigKeys(ImageEditConfig& c) {
  const std::string s = absl::StrCat(kConfigSection, ".");
  return {
      Key(s + "model_path", c.model_path, "a path"),
      Key(s + "enable_fsdp", c.enable_fsdp, "true or false"),
      Key(s + "fsdp_sharding_strategy", c.fsdp_sharding_strategy, "a strategy name"),
      Key(s + "fsdp_cpu_offload", c.fsdp_cpu_offload, "true or false"),
      Key(s + "fsdp_sync_module_states", c.fsdp_sync_module_states, "true or false"),
      Key(s + "enable_cpu_offload", c.enable_cpu_offload, "true or false"),
      Key(s + "torch_dtype", c.torch_dtype, "a dtype name"),
      Key(s + "batch_size", c.batch_size, "an integer"),
      Key(s + "image_size", c.image_size, "an integer"),
      Key(s + "condition_image_size", c.condition_image_size, "an integer"),
      Key(s + "max_pixels", c.max_pixels, "an integer"),
      Key(s + "max_prompt_tokens", c.max_prompt_tokens, "an integer"),
      Key(s + "true_cfg_scale", c.true_cfg_scale, "a number"),
      Key(s + "guidance_scale", c.guidance_scale, "a number"),
      Key(s + "num_inference_steps", c.num_inference_steps, "an integer"),
      Key(s + "negative_prompt", c.negative_prompt, "a string"),
      Key(s + "seed", c.seed, "an integer"),
      Key(s + "device", c.device, "a device (cpu, or cuda: each worker's own GPU)"),
      Key(s + "lora_path", c.lora_path, "a path"),
      Key(s + "cfg_parallel_size", c.cfg_parallel_size, "1 or 2"),
      Key(s + "ulysses_degree", c.ulysses_degree, "an integer"),
      Key(s + "step_cache_threshold", c.step_cache_threshold, "a number"),
      Key(s + "step_cache_warmup_steps", c.step_cache_warmup_steps, "an integer"),
  };
}

std::string ImageEditConfig::EditLayout() const {
  return absl::StrCat(kConfigSection, ".cfg_parallel_size ", cfg_parallel_size,
                      " (--cfg-parallel-size) x ", kConfigSection, ".ulysses_degree ",
                      ulysses_degree, " (--ulysses-degree)");
}

void ImageEditConfig::UseEmbeddedDefaults() {
  num_inference_steps = kEmbeddedSteps;
  image_size = kEmbeddedImageSize;
  condition_image_size = kEmbeddedImageSize;
  negative_prompt = "";  // it was trained without guidance
}

absl::Status ImageEditConfig::CheckFamily(ModelFamily family) const {
  if (family != ModelFamily::kFluxKontext) return absl::OkStatus();
  if (RanksPerEdit() != 1) {
    return absl::UnimplementedError(absl::StrCat(
        EditLayout(), ": CFG and Ulysses parallelism run Qwen-Image models; ", model_path,
        " is FLUX.1 Kontext, whose edits run on one rank each (set both to 1)"));
  }
  if (max_prompt_tokens > kKontextMaxPromptTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(kConfigSection, ".max_prompt_tokens ", max_prompt_tokens, ": ", model_path,
                     " is FLUX.1 Kontext, whose T5 prompts (max_sequence_length) hold at most ",
                     kKontextMaxPromptTokens, " tokens"));
  }
  if (step_cache_threshold > 0) {
    return absl::UnimplementedError(
        absl::StrCat(kConfigSection, ".step_cache_threshold: step caching runs Qwen-Image models; ",
                     model_path, " is FLUX.1 Kontext (set it to 0)"));
  }
  return absl::OkStatus();
}

ModelFamily ImageEditConfig::family() const {
  if (model_path.empty()) return ModelFamily::kQwenImage;
  return ReadModelFamily(model_path).value_or(ModelFamily::kQwenImage);
}

std::string ImageEditConfig::GuidanceSummary(ModelFamily family) const {
  std::string cfg;
  if (negative_prompt.empty()) {
    cfg = "no true CFG (no negative_prompt)";
  } else if (true_cfg_scale <= 1) {
    cfg = absl::StrCat("no true CFG (true_cfg_scale ", true_cfg_scale, ")");
  } else {
    cfg = absl::StrCat("true CFG ", true_cfg_scale, " against \"", negative_prompt, "\"");
  }
  if (family != ModelFamily::kFluxKontext) return cfg;
  return absl::StrCat("guidance ", guidance_scale, ", ", cfg);
}

void ImageEditConfig::UseKontextDefaults() {
  num_inference_steps = 28;
  max_prompt_tokens = kKontextMaxPromptTokens;  // T5's max_sequence_length: longer refused, not cut
  negative_prompt = "";
  true_cfg_scale = 1.0;
}

absl::StatusOr<ImageEditConfig> ImageEditConfig::Load(const std::string& yaml_path,
                                                      const std::vector<std::string>& overrides,
                                                      const std::vector<ConfigKey>& more_keys) {
  YAML::Node document;
  if (!yaml_path.empty()) {
    DRAY_ASSIGN_OR_RETURN(document, ParseYaml(yaml_path, /*is_path=*/true));
  }
  auto resolve = [&](ImageEditConfig config) -> absl::StatusOr<ImageEditConfig> {
    std::vector<ConfigKey> keys = ImageEditConfigKeys(config);
    keys.insert(keys.end(), more_keys.begin(), more_keys.end());
    DRAY_RETURN_IF_ERROR(ApplyYaml(document, yaml_path, keys));
    for (const std::string& text : overrides) DRAY_RETURN_IF_ERROR(ApplyOverride(text, keys));
    DRAY_RETURN_IF_ERROR(config.Validate());
    return config;
  };
  DRAY_ASSIGN_OR_RETURN(ImageEditConfig config, resolve(ImageEditConfig()));
  ImageEditConfig defaults;  // what the model needs: unset keys take these instead
  if (config.model_path.empty()) {
    defaults.UseEmbeddedDefaults();
  } else if (config.family() == ModelFamily::kFluxKontext) {
    defaults.UseKontextDefaults();
  } else {
    return config;
  }
  return resolve(defaults);
}

absl::StatusOr<ImageEditConfig> ImageEditConfig::FromYaml(const std::string& text) {
  DRAY_ASSIGN_OR_RETURN(YAML::Node document, ParseYaml(text, /*is_path=*/false));
  ImageEditConfig config;
  DRAY_RETURN_IF_ERROR(ApplyYaml(document, "config", ImageEditConfigKeys(config)));
  DRAY_RETURN_IF_ERROR(config.Validate());
  return config;
}

std::string ImageEditConfig::ToYaml() const {
  ImageEditConfig copy = *this;
  return KeysToYaml(ImageEditConfigKeys(copy));
}

}  // namespace dray
