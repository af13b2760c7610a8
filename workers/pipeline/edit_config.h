// ImageEditConfig: the `worker.image_edit` section of a job's YAML file, the
// keys dray's image-edit worker and service read, with command-line
// overrides in the same dotted form:
//
//   worker:
//     image_edit:
//       model_path: /models/Qwen-Image-Edit
//       enable_fsdp: true
//       num_inference_steps: 30
//
//   DRAY_ASSIGN_OR_RETURN(ImageEditConfig config,
//       ImageEditConfig::Load("job.yaml", {"worker.image_edit.batch_size=8"}));
//   std::cout << config.ToYaml();  // the resolved configuration
//
// With no model_path, dray runs its embedded default, the tiny model that
// `dray init-model --preset tiny` writes; keys the file and overrides leave
// unset then default to what suits it (20 steps at 256^2, not 50 at 1024^2).
// A FLUX.1 Kontext model_path likewise takes diffusers' FluxKontextPipeline
// defaults (28 steps, guidance_scale 3.5, no true CFG).
//
// An unknown key, a wrong type or an out-of-range value is INVALID_ARGUMENT
// naming the key (and, for unknown keys, listing the valid ones).
#ifndef DRAY_WORKERS_PIPELINE_EDIT_CONFIG_H_
#define DRAY_WORKERS_PIPELINE_EDIT_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "workers/config/yaml_config.h"
#include "workers/models/model_index.h"

namespace dray {

// kConfigSection: where the keys live in a job's YAML file.
inline constexpr char kConfigSection[] = "worker.image_edit";

// Ceilings of max_pixels and max_prompt_tokens: what the transformer's RoPE
// tables (4096 positions) leave room for.
inline constexpr int64_t kMaxOutputPixels = int64_t{4096} * 4096;
inline constexpr int64_t kMaxPromptTokens = 2048;
// FLUX.1 Kontext's: T5's max_sequence_length (diffusers allows 512).
inline constexpr int64_t kKontextMaxPromptTokens = 512;

// The embedded default's step count and working size.
inline constexpr int64_t kEmbeddedSteps = 20;
inline constexpr int64_t kEmbeddedImageSize = 64;

struct ImageEditConfig {
  std::string model_path;    // empty: the embedded tiny model
  bool enable_fsdp = false;  // shard transformer and text encoder by block
  std::string fsdp_sharding_strategy = "FULL_SHARD";
  bool fsdp_cpu_offload = false;        // keep sharded parameters on the CPU
  bool fsdp_sync_module_states = true;  // rank 0 loads, the others receive
  bool enable_cpu_offload = false;      // parameters on the CPU between calls
  std::string torch_dtype = "float32";  // float32, bfloat16, float16, or float64 (numerics checks)
  int64_t batch_size = 4;               // rows per worker call; the service batches up to this
  int64_t image_size = 1024;            // work at about image_size^2 pixels
  int64_t condition_image_size = 384;   // Edit-Plus: the text encoder sees about this^2 per image
  int64_t max_pixels = int64_t{1024} * 1024;  // largest output (width x height) a row may ask
  int64_t max_prompt_tokens = 1024;           // longest instruction or negative prompt, in tokens
  double true_cfg_scale = 4.0;
  // Guidance-distilled models (FLUX.1 Kontext): the guidance strength the
  // transformer embeds (one pass per step). Qwen-Image has none.
  double guidance_scale = 3.5;
  int64_t num_inference_steps = 50;
  std::string negative_prompt = " ";  // empty: no guidance
  int64_t seed = 42;
  std::string device = "cpu";  // cpu, or cuda: the worker's own GPU
  std::string lora_path;       // a LoRA file for the transformer (dray train's final/); empty: none
  // 2: each edit's prompt and negative-prompt passes on two ranks at once
  // (QwenImageEditPipeline::set_cfg_group); 1: one rank runs both.
  int64_t cfg_parallel_size = 1;
  // P > 1: each edit's image tokens split over P ranks, attention exchanging
  // them for heads (Ulysses; QwenImageTransformerImpl::set_sequence_group).
  // The transformer's attention heads must divide by P.
  int64_t ulysses_degree = 1;
  // > 0: first-block caching of each edit's denoising passes
  // (qwen_image::StepCache): the largest relative change of the first
  // block's residual that reuses the other blocks' work. 0: off, exact.
  double step_cache_threshold = 0;
  int64_t step_cache_warmup_steps = 2;  // steps computed whole before any reuse

  // RanksPerEdit: how many consecutive ranks run each edit together
  // (cfg_parallel_size x ulysses_degree, the Ulysses ranks adjacent).
  int64_t RanksPerEdit() const { return cfg_parallel_size * ulysses_degree; }
  // EditLayout names the keys that set RanksPerEdit and their values.
  std::string EditLayout() const;
  // CheckFamily: UNIMPLEMENTED naming the key when the configuration asks
  // what `family`'s models do not run (FLUX.1 Kontext: CFG and Ulysses
  // parallelism, step caching; INVALID_ARGUMENT for prompts longer than
  // kKontextMaxPromptTokens).
  absl::Status CheckFamily(ModelFamily family) const;
  // family: the family model_path's model_index.json names (Qwen-Image for
  // the embedded model, or a directory that cannot be read: loading it
  // says why).
  ModelFamily family() const;
  // GuidanceSummary says which guidance an edit of a `family` model runs
  // under this configuration (FLUX.1 Kontext's embedded guidance; true CFG
  // and its negative prompt, or why none runs), for a command's summary.
  std::string GuidanceSummary(ModelFamily family) const;

  // Load reads `yaml_path` (none when empty), then applies `overrides`
  // ("worker.image_edit.KEY=VALUE", VALUE in YAML syntax), then validates.
  // `more_keys` are other sections the file and overrides may set (dray
  // serve's cluster.*).
  static absl::StatusOr<ImageEditConfig> Load(const std::string& yaml_path,
                                              const std::vector<std::string>& overrides,
                                              const std::vector<ConfigKey>& more_keys = {});
  // FromYaml reads a document in the file layout (what ToYaml writes: how
  // the controller hands its resolved configuration to workers).
  static absl::StatusOr<ImageEditConfig> FromYaml(const std::string& text);
  // ToYaml writes the configuration in the file layout, every key present.
  std::string ToYaml() const;
  // Validate checks every value's range (what Load and FromYaml check).
  absl::Status Validate() const;
  // UseEmbeddedDefaults sets what the embedded model needs (20 steps at
  // kEmbeddedImageSize^2, the text encoder's pictures at that size too, no
  // guidance), for keys a file and overrides leave unset.
  void UseEmbeddedDefaults();
  // UseKontextDefaults sets FluxKontextPipeline's defaults likewise: 28
  // steps, no negative prompt (guidance is embedded, not true CFG), at most
  // 512 prompt tokens (T5's max_sequence_length, which diffusers truncates to).
  void UseKontextDefaults();
};

// ImageEditConfigKeys binds the `worker.image_edit.*` keys to `config`
// (workers/config/yaml_config.h), for configurations that embed it.
std::vector<ConfigKey> ImageEditConfigKeys(ImageEditConfig& config);

}  // namespace dray

#endif  // DRAY_WORKERS_PIPELINE_EDIT_CONFIG_H_
