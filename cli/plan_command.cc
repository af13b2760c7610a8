#include "cli/plan_command.h"

#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "workers/train/memory_plan.h"
#include "workers/train/plan_model.h"
#include "workers/train/train_config.h"

namespace dray {

struct PlanCommand::Flags {
  CLI::App* plan = nullptr;
  std::string model;
  std::string config_file;
  std::vector<std::string> overrides;
  int world_size = 1;
  int shard_group_size = 0;
  std::optional<std::string> strategy, dtype, resolution;
  std::optional<int64_t> lora_rank, micro_batch;
  bool cpu_offload = false;
  bool activation_checkpointing = false;
  int limit_all_gathers = 1;
  int64_t condition_images = 1;
  int64_t text_tokens = 0;
  std::string libtorch = "2";
  std::string attention;  // empty: fused on LibTorch 2, blockwise on 1.13
  std::string collectives = "nccl";
  std::string text_encoders;  // empty: the model's way
  std::string vae = "resident";
  std::string device_memory = "80GiB";
  double allocator_overhead = 0.10;
  std::string context_memory = "0.5GiB";
  bool json = false;
};

namespace {

// Choice: `text` among `choices` (name, value), or INVALID_ARGUMENT naming `flag`.
template <typename T>
absl::StatusOr<T> Choice(const char* flag, const std::string& text,
                         const std::vector<std::pair<const char*, T>>& choices) {
  std::string names;
  for (const auto& [name, value] : choices) {
    if (text == name) return value;
    absl::StrAppend(&names, names.empty() ? "" : ", ", name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " must be one of ", names, ", got '", text, "'"));
}

// ParseBytes reads "24GiB", "24GB", "512MiB", "0.5GiB" or plain bytes.
absl::StatusOr<int64_t> ParseBytes(const char* flag, const std::string& text) {
  static const std::pair<const char*, double> kUnits[] = {
      {"GiB", 1024.0 * 1024 * 1024}, {"MiB", 1024.0 * 1024}, {"GB", 1e9}, {"MB", 1e6}, {"", 1}};
  for (const auto& [unit, scale] : kUnits) {
    if (!absl::EndsWith(text, unit)) continue;
    double value = 0;
    // At most 2^62 bytes (an exabyte): inf, nan and larger are not sizes.
    if (!absl::SimpleAtod(text.substr(0, text.size() - std::string(unit).size()), &value) ||
        !(value >= 0 && value * scale <= 0x1p62)) {
      break;
    }
    return static_cast<int64_t>(std::llround(value * scale));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      flag, " must be a size such as 24GiB, 24GB, 512MiB or a number of bytes, got '", text, "'"));
}

// ParseResolution reads "1024" (square) or "HEIGHTxWIDTH".
absl::Status ParseResolution(const std::string& text, PlanOptions& options) {
  const std::vector<std::string> sides = absl::StrSplit(text, 'x');
  const bool ok = sides.size() <= 2 && absl::SimpleAtoi(sides[0], &options.height) &&
                  absl::SimpleAtoi(sides.back(), &options.width);
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--resolution must be a side (1024) or HEIGHTxWIDTH (768x1360), got '", text, "'"));
  }
  return absl::OkStatus();
}

// Setup: what to plan.
struct Setup {
  std::string model;
  LoraPlan lora;
  PlanOptions options;
  int64_t device_bytes = 0;
};

// Dtypes: torch_dtype's names for the compute dtypes a plan takes.
const std::vector<std::pair<const char*, at::ScalarType>>& Dtypes() {
  static const auto* const dtypes = new std::vector<std::pair<const char*, at::ScalarType>>{
      {"bfloat16", at::kBFloat16}, {"float16", at::kHalf}, {"float32", at::kFloat}};
  return *dtypes;
}

absl::Status ApplyTrainConfig(const PlanCommand::Flags& f, Setup& setup) {
  if (f.config_file.empty() && f.overrides.empty()) return absl::OkStatus();
  // --model as the config's model_path, so that unset keys take dray
  // train's defaults for that model (a Kontext directory's: flow_grpo's
  // LoRA, 128 T5 tokens), not the embedded task's.
  std::vector<std::string> overrides = f.overrides;
  if (!f.model.empty())
    overrides.insert(overrides.begin(), "worker.image_edit.model_path=" + f.model);
  DRAY_ASSIGN_OR_RETURN(TrainConfig config, TrainConfig::Load(f.config_file, overrides));
  if (!config.model.model_path.empty()) setup.model = config.model.model_path;
  // T5 pads each prompt to max_sequence_length: Kontext's max_prompt_tokens.
  if (config.model.family() == ModelFamily::kFluxKontext)
    setup.options.text_tokens = config.model.max_prompt_tokens;
  setup.lora.rank = config.lora_rank;
  if (config.lora_target_modules != TrainConfig().lora_target_modules)
    setup.lora.target_modules = config.lora_target_modules;  // else the family's default
  PlanOptions& o = setup.options;
  DRAY_ASSIGN_OR_RETURN(o.strategy, ParseShardingStrategy(config.model.fsdp_sharding_strategy));
  DRAY_ASSIGN_OR_RETURN(
      o.dtype, Choice("worker.image_edit.torch_dtype", config.model.torch_dtype, Dtypes()));
  o.cpu_offload = config.model.fsdp_cpu_offload;
  o.activation_checkpointing = config.gradient_checkpointing;
  o.micro_batch = config.micro_batch_size;
  o.height = o.width = config.resolution;
  return absl::OkStatus();
}

// ApplyTrainingFlags: what trains, how it is sharded, on what.
absl::Status ApplyTrainingFlags(const PlanCommand::Flags& f, Setup& setup) {
  PlanOptions& o = setup.options;
  if (!f.model.empty()) setup.model = f.model;
  if (f.lora_rank.has_value()) setup.lora.rank = *f.lora_rank;
  if (f.strategy.has_value()) {
    absl::StatusOr<ShardingStrategy> strategy = ParseShardingStrategy(*f.strategy);
    if (!strategy.ok())
      return absl::InvalidArgumentError(absl::StrCat("--strategy: ", strategy.status().message()));
    o.strategy = *strategy;
  }
  if (f.dtype.has_value()) {
    DRAY_ASSIGN_OR_RETURN(o.dtype, Choice("--dtype", *f.dtype, Dtypes()));
  }
  if (f.resolution.has_value()) DRAY_RETURN_IF_ERROR(ParseResolution(*f.resolution, o));
  if (f.micro_batch.has_value()) o.micro_batch = *f.micro_batch;
  o.world_size = f.world_size;
  o.shard_group_size = f.shard_group_size;
  o.cpu_offload = o.cpu_offload || f.cpu_offload;
  o.activation_checkpointing = o.activation_checkpointing || f.activation_checkpointing;
  o.limit_all_gathers = f.limit_all_gathers;
  o.condition_images = f.condition_images;
  if (f.text_tokens != 0) o.text_tokens = f.text_tokens;
  return absl::OkStatus();
}

// ApplyDeviceFlags: the kernels, the frozen models' places, the device.
absl::Status ApplyDeviceFlags(const PlanCommand::Flags& f, Setup& setup) {
  PlanOptions& o = setup.options;
  DRAY_ASSIGN_OR_RETURN(
      o.libtorch,
      Choice<LibTorch>("--libtorch", f.libtorch, {{"2", LibTorch::k2}, {"1.13", LibTorch::k1_13}}));
  const std::string default_kernel = o.libtorch == LibTorch::k1_13 ? "blockwise" : "fused";
  DRAY_ASSIGN_OR_RETURN(
      o.attention,
      Choice<AttentionKernel>(
          "--attention", f.attention.empty() ? default_kernel : f.attention,
          {{"fused", AttentionKernel::kFused}, {"blockwise", AttentionKernel::kBlockwise}}));
  DRAY_ASSIGN_OR_RETURN(o.collectives, Choice<Collectives>("--collectives", f.collectives,
                                                           {{"nccl", Collectives::kNccl},
                                                            {"gloo", Collectives::kGloo}}));
  if (!f.text_encoders.empty()) {
    DRAY_ASSIGN_OR_RETURN(o.text_encoders,
                          Choice<Placement>("--text-encoders", f.text_encoders,
                                            {{"resident", Placement::kResident},
                                             {"sharded", Placement::kSharded},
                                             {"offloaded", Placement::kOffloaded},
                                             {"pre-encoded", Placement::kPreEncoded}}));
  }
  DRAY_ASSIGN_OR_RETURN(o.vae, Choice<Placement>("--vae", f.vae,
                                                 {{"resident", Placement::kResident},
                                                  {"offloaded", Placement::kOffloaded},
                                                  {"pre-encoded", Placement::kPreEncoded}}));
  o.allocator_overhead = f.allocator_overhead;
  DRAY_ASSIGN_OR_RETURN(o.context_bytes, ParseBytes("--context-memory", f.context_memory));
  DRAY_ASSIGN_OR_RETURN(setup.device_bytes, ParseBytes("--device-memory", f.device_memory));
  return absl::OkStatus();
}

// ReadSetup: the plan's defaults, then the train config's, then the flags'.
absl::StatusOr<Setup> ReadSetup(const PlanCommand::Flags& f) {
  Setup setup;
  setup.model = "embedded";
  setup.lora.rank = TrainConfig().lora_rank;
  DRAY_RETURN_IF_ERROR(ApplyTrainConfig(f, setup));
  DRAY_RETURN_IF_ERROR(ApplyTrainingFlags(f, setup));
  DRAY_RETURN_IF_ERROR(ApplyDeviceFlags(f, setup));
  DRAY_RETURN_IF_ERROR(setup.options.Validate());
  return setup;
}

std::string Count(int64_t n) {
  return n >= 1000000000 ? absl::StrFormat("%.2fB", n / 1e9) : absl::StrFormat("%.2fM", n / 1e6);
}

// Describe: the setup in one paragraph.
std::string Describe(const PlanModel& model, const Setup& setup, const MemoryPlan& plan) {
  const PlanOptions& o = setup.options;
  const std::string training =
      setup.lora.rank > 0
          ? absl::StrCat(Count(model.trainable()), " trainable (LoRA rank ", setup.lora.rank, ")")
          : "full fine-tuning";
  const int64_t per_image = o.height / 16 * (o.width / 16);
  return absl::StrCat(
      model.name, ": ", Count(model.parameters()), " parameters, ", training, ", ",
      model.units.size(), " blocks\n", o.world_size, o.world_size == 1 ? " rank, " : " ranks, ",
      ShardingStrategyName(o.strategy), ", ",
      o.dtype == at::kFloat  ? "float32"
      : o.dtype == at::kHalf ? "float16 over float32 masters"
                             : "bfloat16 over float32 masters",
      o.cpu_offload ? ", CPU offload" : "",
      o.activation_checkpointing ? ", activation checkpointing" : "", ", micro-batch ",
      o.micro_batch, ", ", o.height, "x", o.width, ": ", per_image, " noisy + ",
      per_image * o.condition_images, " condition image tokens + ", plan.text_tokens,
      " text tokens, ", o.attention == AttentionKernel::kFused ? "fused" : "blockwise",
      " attention\n");
}

void PrintTable(const PlanModel& model, const Setup& setup, const MemoryPlan& plan,
                const FitVerdict& verdict) {
  std::printf("%s", Describe(model, setup, plan).c_str());
  std::printf("%-12s %10s  %s\n", "term", "GiB", "parts");
  const double gib = 1 << 30;
  for (const MemoryTerm& term : plan.terms)
    std::printf("%-12s %10.2f  %s\n", term.name.c_str(), term.bytes / gib, term.detail.c_str());
  std::printf("%-12s %10.2f  of %.2f GiB on the device; peak in the %s\n", "total",
              plan.total / gib, setup.device_bytes / gib, plan.peak_at.c_str());
  if (plan.host_bytes > 0)
    std::printf("host memory per rank: %.2f GiB (offloaded)\n", plan.host_bytes / gib);
  std::printf("%s\n", verdict.reason.c_str());
}

void PrintJson(const PlanModel& model, const Setup& setup, const MemoryPlan& plan,
               const FitVerdict& verdict) {
  nlohmann::json terms = nlohmann::json::array();
  for (const MemoryTerm& term : plan.terms)
    terms.push_back({{"name", term.name}, {"bytes", term.bytes}, {"detail", term.detail}});
  const PlanOptions& o = setup.options;
  const nlohmann::json json = {{"model", model.name},
                               {"parameters", model.parameters()},
                               {"trainable", model.trainable()},
                               {"lora_rank", setup.lora.rank},
                               {"world_size", o.world_size},
                               {"strategy", std::string(ShardingStrategyName(o.strategy))},
                               {"cpu_offload", o.cpu_offload},
                               {"activation_checkpointing", o.activation_checkpointing},
                               {"micro_batch", o.micro_batch},
                               {"image_tokens", plan.image_tokens},
                               {"text_tokens", plan.text_tokens},
                               {"terms", terms},
                               {"total_bytes", plan.total},
                               {"device_bytes", setup.device_bytes},
                               {"host_bytes", plan.host_bytes},
                               {"peak_at", plan.peak_at},
                               {"fits", verdict.fits},
                               {"dominant", verdict.dominant},
                               {"reason", verdict.reason}};
  std::printf("%s\n", json.dump(2).c_str());
}

absl::Status Plan(const PlanCommand::Flags& f) {
  DRAY_ASSIGN_OR_RETURN(Setup setup, ReadSetup(f));
  DRAY_ASSIGN_OR_RETURN(PlanModel model, LoadPlanModel(setup.model, setup.lora));
  DRAY_ASSIGN_OR_RETURN(MemoryPlan plan, PlanMemory(model, setup.options));
  const FitVerdict verdict = Verdict(plan, setup.device_bytes);
  (f.json ? PrintJson : PrintTable)(model, setup, plan, verdict);
  return absl::OkStatus();
}

}  // namespace

PlanCommand::PlanCommand(CLI::App& app) : flags_(std::make_unique<Flags>()) {
  Flags& f = *flags_;
  f.plan = app.add_subcommand(
      "plan",
      "predict each rank's peak memory in a training step (parameters, gradients, optimizer, "
      "activations, buffers) and whether it fits the device");
  CLI::App* p = f.plan;
  p->add_option("--model", f.model,
                absl::StrCat("a preset (", kPlanPresets,
                             ") or a model directory; default: the config's "
                             "worker.image_edit.model_path, else the embedded model"));
  p->add_option("--config", f.config_file, "a train config YAML, as dray train reads it");
  p->add_option("overrides", f.overrides, "SECTION.KEY=VALUE overrides of the train config");
  p->add_option("--world-size", f.world_size, "ranks (GPUs) in all")->capture_default_str();
  p->add_option("--strategy", f.strategy,
                "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or HYBRID_SHARD_ZERO2 "
                "(default: the config's, else FULL_SHARD)");
  p->add_option("--shard-group-size", f.shard_group_size,
                "HYBRID_*: ranks per shard group, e.g. GPUs per node (default: all)");
  p->add_option("--dtype", f.dtype,
                "compute dtype over float32 masters: bfloat16, float16 or float32 (default: the "
                "config's, else bfloat16)");
  p->add_flag("--cpu-offload", f.cpu_offload,
              "keep masters, gradients, AdamW's state and frozen shards in host memory");
  p->add_flag("--activation-checkpointing", f.activation_checkpointing,
              "recompute each block in backward instead of keeping its activations");
  p->add_option("--lora-rank", f.lora_rank,
                "LoRA rank; 0: full fine-tuning (default: the train config's, else 32)");
  p->add_option("--micro-batch", f.micro_batch, "samples per forward (default: 1)");
  p->add_option("--resolution", f.resolution, "pixels: a side or HEIGHTxWIDTH (default: 1024)");
  p->add_option("--condition-images", f.condition_images, "condition images per sample")
      ->capture_default_str();
  p->add_option("--text-tokens", f.text_tokens,
                "the text encoder's tokens (default: the model's; FLUX.1: 512, or a Kontext "
                "train config's max_prompt_tokens)");
  p->add_option("--limit-all-gathers", f.limit_all_gathers,
                "units gathered at once (FULL_SHARD prefetching; 1: none, as dray train)")
      ->capture_default_str();
  p->add_option("--libtorch", f.libtorch,
                "the LibTorch the job runs: 2 (GPU builds; zero_grad frees gradients) or 1.13 "
                "(Debian 12's: zero_grad keeps them)")
      ->capture_default_str();
  p->add_option("--attention", f.attention,
                "fused (flash/memory-efficient; LibTorch 2's default) or blockwise (1.13's)");
  p->add_option("--collectives", f.collectives, "nccl or gloo (its staging buffers)")
      ->capture_default_str();
  p->add_option("--text-encoders", f.text_encoders,
                "resident, sharded, offloaded or pre-encoded (prompts encoded ahead); default: "
                "sharded (as dray train)");
  p->add_option("--vae", f.vae, "resident, offloaded or pre-encoded (latents encoded ahead)")
      ->capture_default_str();
  p->add_option("--device-memory", f.device_memory, "the device's memory, e.g. 24GiB")
      ->capture_default_str();
  p->add_option("--allocator-overhead", f.allocator_overhead,
                "fraction added for the caching allocator's fragmentation")
      ->capture_default_str();
  p->add_option("--context-memory", f.context_memory,
                "memory outside the allocator (CUDA context, kernels)")
      ->capture_default_str();
  p->add_flag("--json", f.json, "one JSON object instead of the table");
}

PlanCommand::~PlanCommand() = default;

std::optional<int> PlanCommand::Run() {
  if (!*flags_->plan) return std::nullopt;
  if (const absl::Status planned = Plan(*flags_); !planned.ok()) {
    Log("plan", planned.ToString());
    return 1;
  }
  return 0;
}

}  // namespace dray
