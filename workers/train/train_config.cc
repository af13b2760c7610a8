#include "workers/train/train_config.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "base/status_macros.h"
#include "runtime/sharding/strategy.h"
#include "workers/config/yaml_config.h"
#include "workers/models/flux/transformer.h"
#include "workers/rl/advantages.h"
#include "workers/rl/nft_loss.h"
#include "workers/rl/ode_sampler.h"
#include "workers/rl/policy_loss.h"
#include "workers/rl/sde_step.h"
#include "workers/train/rewards.h"

namespace dray {
namespace {

// RemoteRewardsKey binds worker.reward.remote: a list of scorer mappings,
// each field checked by name.
ConfigKey RemoteRewardsKey(std::vector<RemoteRewardConfig>& member) {
  static constexpr char kKey[] = "worker.reward.remote";
  auto set = [&member](const YAML::Node& value) -> absl::Status {
    if (!value.IsSequence()) {
      return absl::InvalidArgumentError(absl::StrCat(
          kKey, " must be a list of {name, address, ...}, got '", YAML::Dump(value), "'"));
    }
    std::vector<RemoteRewardConfig> scorers;
    for (size_t i = 0; i < value.size(); ++i) {
      const std::string where = absl::StrCat(kKey, "[", i, "]");
      if (!value[i].IsMap()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " must be a mapping {name, address, ...}"));
      }
      RemoteRewardConfig& c = scorers.emplace_back();
      const std::vector<ConfigKey> fields = {
          Key("name", c.name, "a string"),
          Key("address", c.address, "host:port"),
          Key("weight", c.weight, "a number"),
          Key("timeout_ms", c.timeout_ms, "an integer"),
          Key("max_batch", c.max_batch, "an integer"),
          Key("max_retries", c.max_retries, "an integer"),
          Key("tls_ca", c.tls_ca, "a path"),
          Key("token_env", c.token_env, "an environment variable's name")};
      const absl::Status applied = ApplyYaml(value[i], where, fields);
      if (!applied.ok()) return applied;
      if (c.name.empty() || c.address.empty())
        return absl::InvalidArgumentError(absl::StrCat(where, " needs a name and an address"));
    }
    member = std::move(scorers);
    return absl::OkStatus();
  };
  auto get = [&member] {
    YAML::Node list(YAML::NodeType::Sequence);
    for (const RemoteRewardConfig& c : member) {
      YAML::Node node(YAML::NodeType::Map);
      node["name"] = c.name;
      node["address"] = c.address;
      node["weight"] = c.weight;
      node["timeout_ms"] = c.timeout_ms;
      node["max_batch"] = c.max_batch;
      node["max_retries"] = c.max_retries;
      node["tls_ca"] = c.tls_ca;
      node["token_env"] = c.token_env;
      list.push_back(node);
    }
    return list;
  };
  return {kKey, set, get};
}

// OwnedKeys: keys only some algorithms read, by their algorithm.name.
struct OwnedKeys {
  std::vector<std::string> owners;
  std::vector<ConfigKey> keys;
};

// OwnKeys: every algorithm's own keys.
std::vector<OwnedKeys> OwnKeys(TrainConfig& c) {
  rl::MixGrpoWindowOptions& w = c.mix_window;
  return {
      {{"mix_grpo"},
       {Key("algorithm.sample_strategy", w.strategy, "progressive, decay, exp_decay or random"),
        Key("algorithm.iters_per_group", w.iters_per_group, "an integer"),
        Key("algorithm.prog_overlap", w.prog_overlap, "true or false"),
        Key("algorithm.prog_overlap_step", w.prog_overlap_step, "an integer"),
        Key("algorithm.roll_back", w.roll_back, "true or false"),
        Key("algorithm.max_iters_per_group", w.max_iters_per_group, "an integer"),
        Key("algorithm.min_iters_per_group", w.min_iters_per_group, "an integer"),
        Key("algorithm.kl_coeff", c.kl_coeff, "a number"),
        Key("algorithm.trimmed_ratio", c.trimmed_ratio, "a number"),
        Key("algorithm.multi_reward_mix", c.multi_reward_mix, "reward_aggr or advantage_aggr")}},
      {{"dance_grpo"}, {Key("algorithm.shift", c.shift, "a number")}},
      {{"dance_grpo", "mix_grpo"},
       {Key("algorithm.init_same_noise", c.init_same_noise, "true or false")}},
      {{"dpo"},
       {Key("algorithm.dpo_pairs", c.dpo_pairs, "data or samples"),
        Key("algorithm.ref_update_step", c.ref_update_step, "an integer")}},
      {{"diffusion_nft"},
       {Key("algorithm.nft_beta", c.nft_beta, "a number"),
        Key("algorithm.decay_type", c.decay_type, "0, 1 or 2"),
        Key("algorithm.adv_mode", c.adv_mode,
            "all, positive_only, negative_only, one_only or binary"),
        Key("algorithm.solver", c.solver, "flow or dpm2")}},
      {{"dmd2"},
       {Key("algorithm.num_denoising_step", c.num_denoising_step, "an integer"),
        Key("algorithm.backward_simulation", c.backward_simulation, "true or false"),
        Key("algorithm.real_guidance_scale", c.real_guidance_scale, "a number"),
        Key("algorithm.min_step_percent", c.min_step_percent, "a number"),
        Key("algorithm.max_step_percent", c.max_step_percent, "a number"),
        Key("algorithm.dm_loss_weight", c.dm_loss_weight, "a number"),
        Key("algorithm.guidance_lr", c.guidance_lr, "a number"),
        Key("algorithm.dfake_gen_update_ratio", c.dfake_gen_update_ratio, "an integer"),
        Key("algorithm.real_score.fsdp_sharding_strategy", c.real_score.fsdp_sharding_strategy,
            "a strategy name"),
        Key("algorithm.real_score.torch_dtype", c.real_score.torch_dtype, "a dtype"),
        Key("algorithm.fake_score.fsdp_sharding_strategy", c.fake_score.fsdp_sharding_strategy,
            "a strategy name"),
        Key("algorithm.fake_score.torch_dtype", c.fake_score.torch_dtype, "a dtype"),
        Key("algorithm.cls_on_clean_image", c.cls_on_clean_image, "true or false"),
        Key("algorithm.gen_cls_loss", c.gen_cls_loss, "true or false"),
        Key("algorithm.gen_cls_loss_weight", c.gen_cls_loss_weight, "a number"),
        Key("algorithm.guidance_cls_loss_weight", c.guidance_cls_loss_weight, "a number"),
        Key("algorithm.diffusion_gan", c.diffusion_gan, "true or false"),
        Key("algorithm.diffusion_gan_max_timestep", c.diffusion_gan_max_timestep, "an integer")}}};
}

// kServingOnlyKeys: the keys of worker.image_edit that only dray edit and
// dray serve read, each with why: training shards the model on every rank,
// each rank's rows its own, and runs every block of every step.
constexpr std::pair<const char*, const char*> kServingOnlyKeys[] = {
    {"enable_fsdp",
     "does not apply to dray train, which always shards the model "
     "(worker.image_edit.fsdp_sharding_strategy says how; NO_SHARD replicates it)"},
    {"enable_cpu_offload",
     "applies to dray edit and dray serve (parameters on the CPU between calls); training keeps "
     "them on the device (worker.image_edit.fsdp_cpu_offload offloads the shards)"},
    {"batch_size",
     "applies to dray edit and dray serve; training's rows are data.prompts_per_step a step "
     "(times algorithm.group_size for GRPO), worker.actor.micro_batch_size a forward"},
    {"num_inference_steps",
     "does not apply to dray train, whose edits take worker.rollout.num_inference_steps steps "
     "(dmd2: algorithm.num_denoising_step)"},
    {"seed", "does not apply to dray train, whose noise comes from trainer.seed"},
    {"lora_path",
     "applies to dray edit and dray serve; dray train trains new adapters "
     "(worker.actor.lora_rank) on model_path (to go on from a run: trainer.resume)"},
    {"cfg_parallel_size",
     "applies to dray edit and dray serve (one edit's two CFG passes on two ranks); training's "
     "ranks each hold rows of their own"},
    {"ulysses_degree",
     "applies to dray edit and dray serve (one edit's tokens over several ranks); training's "
     "ranks each hold rows of their own"},
    {"step_cache_threshold",
     "applies to dray edit and dray serve; training runs every block of every step"},
    {"step_cache_warmup_steps",
     "applies to dray edit and dray serve; training runs every block of every step"},
};

// kEarlierConfigHint: what to do where a config.yaml of an earlier dray,
// which wrote every key, lists one this dray refuses.
constexpr char kEarlierConfigHint[] =
    " (a config.yaml written by an earlier dray lists it: delete the line)";

// UnreadModelKeys: the keys of worker.image_edit that `c` does not read
// from a `family` model: serving's own, and those of the other family or
// that worker.rollout.resolution stands in for; each with why.
std::map<std::string, std::string> UnreadModelKeys(const TrainConfig& c, ModelFamily family) {
  std::map<std::string, std::string> unread;
  for (const auto& [key, why] : kServingOnlyKeys) unread[key] = why;
  unread["max_pixels"] =
      "applies to dray edit and dray serve (the largest output a request may ask); dray train's "
      "outputs are about worker.rollout.resolution^2 pixels";
  const bool kontext = family == ModelFamily::kFluxKontext;
  if (c.sft() || kontext) {
    unread["image_size"] = absl::StrCat(
        "does not apply to dray train's ", kontext ? "FLUX.1 Kontext" : "sft",
        " runs, whose edits are about worker.rollout.resolution^2 pixels (set that instead)");
  }
  if (!kontext) {
    unread["guidance_scale"] =
        "applies to guidance-distilled models (FLUX.1 Kontext); Qwen-Image models are guided by "
        "true CFG (worker.image_edit.true_cfg_scale with a negative_prompt)";
    unread["max_prompt_tokens"] =
        "applies to dray train with FLUX.1 Kontext models (T5's prompt length) and to dray edit "
        "and dray serve; dray train encodes a Qwen-Image model's prompts whole";
  }
  std::map<std::string, std::string> keyed;
  for (const auto& [key, why] : unread)
    keyed[absl::StrCat(kConfigSection, ".", key)] = absl::StrCat(why, kEarlierConfigHint);
  return keyed;
}

// UnreadKeys: the keys `c` does not read from a `family` model (the model's
// own above, under its algorithm, or without trainer.async), each with why.
std::map<std::string, std::string> UnreadKeys(const TrainConfig& c, ModelFamily family) {
  std::map<std::string, std::string> unread = UnreadModelKeys(c, family);
  if (c.nft()) {
    for (const char* key :
         {"algorithm.loss", "algorithm.clip_range", "algorithm.noise_level", "algorithm.sde_type",
          "algorithm.sde_window_size", "algorithm.sde_window_range"})
      unread[key] =
          "does not apply to diffusion_nft, whose rollouts are deterministic (algorithm.solver) "
          "and whose loss is its own";
  }
  if (c.dmd2()) {
    for (const char* key :
         {"algorithm.adv_estimator", "algorithm.loss", "algorithm.group_size",
          "algorithm.global_std", "algorithm.clip_range", "algorithm.adv_clip_max",
          "algorithm.beta", "algorithm.timestep_fraction", "algorithm.num_inner_epochs",
          "algorithm.noise_level", "algorithm.sde_type", "algorithm.sde_window_size",
          "algorithm.sde_window_range", "worker.rollout.num_inference_steps", "trainer.async"})
      unread[key] =
          "does not apply to dmd2, which distils the model into a generator of "
          "algorithm.num_denoising_step steps by its own losses (no rollouts, no rewards to learn)";
  }
  if (c.dmd2() && c.lora_rank > 0) {
    for (const char* key :
         {"algorithm.real_score.fsdp_sharding_strategy", "algorithm.real_score.torch_dtype"})
      unread[key] =
          "applies only where the real score is a copy (full fine-tuning, worker.actor.lora_rank "
          "0): with LoRA it is the generator's own base, placed as worker.image_edit says";
  }
  if (!c.async_rollout) {
    for (const char* key :
         {"trainer.max_staleness", "worker.rollout.num_workers", "algorithm.rollout_is_threshold"})
      unread[key] = "applies only with trainer.async: true";
  }
  return unread;
}

// TrainingShardingError: INVALID_ARGUMENT where `placed` (a model as
// training shards it, always under FSDP) asks for mixed precision or CPU
// offload without sharding, which FSDP cannot do; its keys under `section`.
absl::Status TrainingShardingError(const ImageEditConfig& placed, const std::string& section) {
  const absl::StatusOr<ShardingStrategy> strategy =
      ParseShardingStrategy(placed.fsdp_sharding_strategy);
  if (!strategy.ok() || *strategy != ShardingStrategy::kNoShard) return absl::OkStatus();
  const bool mixed = placed.torch_dtype == "bfloat16" || placed.torch_dtype == "float16";
  if (!mixed && !placed.fsdp_cpu_offload) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      section, ".fsdp_sharding_strategy NO_SHARD cannot go with ",
      mixed ? absl::StrCat(section, ".torch_dtype ", placed.torch_dtype, " (mixed precision)")
            : "worker.image_edit.fsdp_cpu_offload",
      ": FSDP keeps float32 masters and offloads only shards; use FULL_SHARD or another "
      "strategy, or float32"));
}

bool IsOwner(const OwnedKeys& owned, const std::string& name) {
  return std::find(owned.owners.begin(), owned.owners.end(), name) != owned.owners.end();
}

// KeysSetIn: the dotted keys `document` and `overrides` ("key=VALUE") set.
std::set<std::string> KeysSetIn(const YAML::Node& document,
                                const std::vector<std::string>& overrides) {
  std::set<std::string> keys;
  std::function<void(const YAML::Node&, const std::string&)> walk = [&](const YAML::Node& node,
                                                                        const std::string& at) {
    if (!node.IsMap()) {
      if (!at.empty()) keys.insert(at);
      return;
    }
    for (const auto& entry : node)
      walk(entry.second, at.empty() ? entry.first.as<std::string>()
                                    : absl::StrCat(at, ".", entry.first.as<std::string>()));
  };
  walk(document, "");
  for (const std::string& text : overrides) keys.insert(text.substr(0, text.find('=')));
  return keys;
}

// ForeignKeyError: INVALID_ARGUMENT for the first key in `set` that `c`
// does not read (UnreadKeys) or that other algorithms own (OwnKeys).
absl::Status ForeignKeyError(TrainConfig c, ModelFamily family, const std::set<std::string>& set) {
  for (const auto& [key, why] : UnreadKeys(c, family)) {
    if (set.count(key) > 0) return absl::InvalidArgumentError(absl::StrCat(key, " ", why));
  }
  for (const OwnedKeys& owned : OwnKeys(c)) {
    if (IsOwner(owned, c.name)) continue;
    for (const ConfigKey& key : owned.keys) {
      if (set.count(key.key) > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            key.key, " is ", absl::StrJoin(owned.owners, "'s or "), "'s: set algorithm.name ",
            absl::StrJoin(owned.owners, " or "), " to use it, not ", c.name));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<ConfigKey> Keys(TrainConfig& c) {
  std::vector<ConfigKey> keys = {
      Key("data.train_files", c.train_files, "a path"),
      Key("data.prompts_per_step", c.prompts_per_step, "an integer"),
      Key("algorithm.name", c.name, "a name"),
      Key("algorithm.adv_estimator", c.adv_estimator, "a name"),
      Key("algorithm.loss", c.loss, "a name"),
      Key("algorithm.group_size", c.group_size, "an integer"),
      Key("algorithm.global_std", c.global_std, "true or false"),
      Key("algorithm.clip_range", c.clip_range, "a number"),
      Key("algorithm.adv_clip_max", c.adv_clip_max, "a number"),
      Key("algorithm.beta", c.beta, "a number"),
      Key("algorithm.timestep_fraction", c.timestep_fraction, "a number"),
      Key("algorithm.num_inner_epochs", c.num_inner_epochs, "an integer"),
      Key("algorithm.noise_level", c.noise_level, "a number"),
      Key("algorithm.sde_type", c.sde_type, "sde or cps"),
      Key("algorithm.sde_window_size", c.sde_window_size, "an integer"),
      Key("algorithm.sde_window_range", c.sde_window_range, "a list of two integers"),
  };
  for (OwnedKeys& owned : OwnKeys(c)) {
    for (ConfigKey& key : owned.keys) keys.push_back(std::move(key));
  }
  for (ConfigKey& key : ImageEditConfigKeys(c.model)) keys.push_back(std::move(key));
  for (ConfigKey& key : std::vector<ConfigKey>{
           Key("worker.actor.lr", c.lr, "a number"),
           Key("worker.actor.lr_warmup_steps", c.lr_warmup_steps, "an integer"),
           Key("worker.actor.weight_decay", c.weight_decay, "a number"),
           Key("worker.actor.max_grad_norm", c.max_grad_norm, "a number"),
           Key("worker.actor.micro_batch_size", c.micro_batch_size, "an integer"),
           Key("worker.actor.lora_rank", c.lora_rank, "an integer"),
           Key("worker.actor.lora_alpha", c.lora_alpha, "a number"),
           Key("worker.actor.lora_target_modules", c.lora_target_modules, "a list of names"),
           Key("worker.actor.gradient_checkpointing", c.gradient_checkpointing, "true or false"),
           Key("worker.rollout.num_inference_steps", c.num_inference_steps, "an integer"),
           Key("worker.rollout.resolution", c.resolution, "an integer"),
           Key("worker.rollout.num_workers", c.rollout_workers, "an integer"),
           Key("worker.reward.functions", c.reward_functions, "a list of names"),
           Key("worker.reward.weights", c.reward_weights, "a list of numbers"),
           Key("worker.reward.placement", c.reward_placement, "controller, colocated or separate"),
           Key("worker.reward.num_workers", c.reward_workers, "an integer"),
           RemoteRewardsKey(c.remote_rewards),
           Key("trainer.total_steps", c.total_steps, "an integer"),
           Key("trainer.save_dir", c.save_dir, "a path"),
           Key("trainer.seed", c.seed, "an integer"),
           Key("trainer.log_every", c.log_every, "an integer"),
           Key("trainer.sample_every", c.sample_every, "an integer"),
           Key("trainer.on_nan", c.on_nan, "stop or skip"),
           Key("trainer.save_every", c.save_every, "an integer"),
           Key("trainer.keep_last", c.keep_last, "an integer"),
           Key("trainer.resume", c.resume, "never, auto or a checkpoint directory"),
           Key("trainer.max_restarts", c.max_restarts, "an integer"),
           Key("trainer.async", c.async_rollout, "true or false"),
           Key("trainer.max_staleness", c.max_staleness, "an integer"),
           Key("algorithm.rollout_is_threshold", c.rollout_is_threshold, "a number"),
       }) {
    keys.push_back(std::move(key));
  }
  for (ConfigKey& key : ClusterConfigKeys(c.cluster)) keys.push_back(std::move(key));
  return keys;
}

// EmbeddedDefaults: the tiny model, a few minutes on two CPU cores, for
// `algorithm` (algorithm.name), on the embedded task or the user's data.
TrainConfig EmbeddedDefaults(const std::string& algorithm, bool embedded_task) {
  TrainConfig c;
  if (embedded_task) c.reward_functions = {"target_psnr"};
  c.model.UseEmbeddedDefaults();
  c.model.image_size = 64;
  c.prompts_per_step = 4;
  c.group_size = 4;
  c.num_inference_steps = 8;
  c.resolution = 64;
  c.global_std = false;
  // Adam moves each adapter weight by about lr a step: GRPO at 1e-2
  // collapses the embedded task onto one picture for every input
  // (docs/training.md); SFT and the VAE start from weights fitted to the
  // embedded pairs.
  c.lr = algorithm == "sft" ? 1e-3 : algorithm == "vae" ? 1e-4 : 3e-3;
  c.weight_decay = 0;
  c.micro_batch_size = 4;
  c.lora_rank = 8;
  c.lora_alpha = 16;
  c.total_steps = 30;
  c.sample_every = 10;
  // MixGRPO's window visits the 6 trainable of 8 steps within the 30 steps.
  if (algorithm == "mix_grpo") c.mix_window.iters_per_group = 4;
  // DMD2 distils the embedded model guided (true CFG 4, 40 passes an edit
  // in 20 steps) into an unguided generator of 4 steps (docs/training.md,
  // "DMD2"); its fake score trains the whole transformer, more gently than
  // the generator's adapters.
  if (algorithm == "dmd2") {
    c.real_guidance_scale = 4;
    c.model.negative_prompt = " ";
    c.lr = 1e-3;
    c.guidance_lr = 1e-4;
    c.total_steps = 300;
    c.sample_every = 50;
  }
  return c;
}

}  // namespace

const Algorithm* FindAlgorithm(const std::string& name) {
  for (const Algorithm& algorithm : kAlgorithms) {
    if (name == algorithm.name) return &algorithm;
  }
  return nullptr;
}

std::string AlgorithmNames(bool grpo_only) {
  std::vector<std::string> names;
  for (const Algorithm& algorithm : kAlgorithms) {
    if (!grpo_only || algorithm.grpo) names.push_back(algorithm.name);
  }
  const std::string last = names.back();
  names.pop_back();
  return absl::StrCat(absl::StrJoin(names, ", "), " or ", last);
}

absl::Status TrainConfig::Validate() const {
  auto bad = [](const char* key, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(key, " ", why));
  };
  DRAY_RETURN_IF_ERROR(model.Validate());
  DRAY_RETURN_IF_ERROR(TrainingShardingError(model, "worker.image_edit"));
  if (prompts_per_step < 1) return bad("data.prompts_per_step", "must be at least 1");
  if (!rl::FindAdvantageEstimator(adv_estimator).ok())
    return bad("algorithm.adv_estimator",
               absl::StrCat("'", adv_estimator, "' is not registered (registered: ",
                            absl::StrJoin(rl::AdvantageEstimatorNames(), ", "), ")"));
  if (!rl::FindPolicyLoss(loss).ok())
    return bad("algorithm.loss", absl::StrCat("'", loss, "' is not registered (registered: ",
                                              absl::StrJoin(rl::PolicyLossNames(), ", "), ")"));
  if (group_size < 2) return bad("algorithm.group_size", "must be at least 2 (a group to compare)");
  if (FindAlgorithm(name) == nullptr)
    return bad("algorithm.name", absl::StrCat("must be ", AlgorithmNames()));
  if (dpo_pairs != "data" && dpo_pairs != "samples")
    return bad("algorithm.dpo_pairs", "must be data or samples");
  if (name == "dance_grpo" && !(shift > 0)) return bad("algorithm.shift", "must be > 0");
  const bool window_range_set = sde_window_range != std::vector<int64_t>{0, 0};
  if (name == "dance_grpo" && (sde_window_size > 0 || window_range_set))
    return bad(sde_window_size > 0 ? "algorithm.sde_window_size" : "algorithm.sde_window_range",
               "does not apply to dance_grpo, whose every step is stochastic");
  if (name == "mix_grpo" && window_range_set)
    return bad(
        "algorithm.sde_window_range",
        "does not apply to mix_grpo, whose window slides over steps 0..num_inference_steps-3");
  if (dpo() && !(beta > 0)) return bad("algorithm.beta", "must be > 0 for dpo (DPO's beta)");
  if (ref_update_step < 0)
    return bad("algorithm.ref_update_step", "must be >= 0 (0: the base model is the reference)");
  if (dpo() && paired() && !remote_rewards.empty())
    return bad("worker.reward.remote",
               "does not score DPO on data's edits: name worker.reward.functions instead");
  if (name == "mix_grpo") {
    DRAY_RETURN_IF_ERROR(rl::ValidateMixGrpoWindow(MixWindow()));
    if (!(kl_coeff >= 0)) return bad("algorithm.kl_coeff", "must be >= 0");
    if (!(trimmed_ratio >= 0 && trimmed_ratio < 1))
      return bad("algorithm.trimmed_ratio", "must lie in [0, 1)");
    if (multi_reward_mix != "reward_aggr" && multi_reward_mix != "advantage_aggr")
      return bad("algorithm.multi_reward_mix", "must be reward_aggr or advantage_aggr");
    if (trimmed_ratio > 0 && adv_estimator != "dance_grpo")
      return bad("algorithm.trimmed_ratio", "needs algorithm.adv_estimator dance_grpo");
  }
  if (nft()) {
    if (!(nft_beta > 0)) return bad("algorithm.nft_beta", "must be > 0");
    if (!rl::NftOldPolicyDecay(0, static_cast<int>(decay_type)).ok())
      return bad("algorithm.decay_type", "must be 0, 1 or 2");
    const std::set<std::string> modes = {"all", "positive_only", "negative_only", "one_only",
                                         "binary"};
    if (modes.count(adv_mode) == 0)
      return bad(
          "algorithm.adv_mode",
          absl::StrCat("must be all, positive_only, negative_only, one_only or binary, not '",
                       adv_mode, "'"));
    if (!rl::ParseOdeSolver(solver).ok())
      return bad("algorithm.solver", absl::StrCat("must be flow or dpm2, not '", solver, "'"));
  }
  if (dmd2()) {
    if (!(num_denoising_step >= 1 && num_denoising_step <= 1000))
      return bad("algorithm.num_denoising_step", "must lie in 1 .. 1000");
    if (!backward_simulation && num_denoising_step > 1)
      return bad("algorithm.backward_simulation",
                 "false trains the generator from pure noise alone: it needs "
                 "algorithm.num_denoising_step 1");
    if (!(min_step_percent >= 0 && min_step_percent <= max_step_percent && max_step_percent <= 1))
      return bad("algorithm.min_step_percent",
                 "and algorithm.max_step_percent must satisfy 0 <= min <= max <= 1");
    if (!(real_guidance_scale >= 1))
      return bad("algorithm.real_guidance_scale", "must be >= 1 (1: no guidance)");
    if (real_guidance_scale > 1 && model.negative_prompt.empty())
      return bad("algorithm.real_guidance_scale",
                 "> 1 guides the real score with worker.image_edit.negative_prompt, which is "
                 "empty: set one, or set the scale to 1");
    if (!(guidance_lr > 0)) return bad("algorithm.guidance_lr", "must be > 0");
    if (!(dm_loss_weight > 0)) return bad("algorithm.dm_loss_weight", "must be > 0");
    if (dfake_gen_update_ratio < 1)
      return bad("algorithm.dfake_gen_update_ratio", "must be at least 1");
    if (!(gen_cls_loss_weight >= 0)) return bad("algorithm.gen_cls_loss_weight", "must be >= 0");
    if (!(guidance_cls_loss_weight >= 0))
      return bad("algorithm.guidance_cls_loss_weight", "must be >= 0");
    if (diffusion_gan && !(diffusion_gan_max_timestep >= 1 && diffusion_gan_max_timestep <= 1000))
      return bad("algorithm.diffusion_gan_max_timestep",
                 "must lie in 1 .. 1000 with algorithm.diffusion_gan (noise levels below it)");
    for (const auto& [name, sharding] :
         {std::pair{"real_score", &real_score}, std::pair{"fake_score", &fake_score}}) {
      if (absl::Status placed = ScoreModelConfig(*sharding).Validate(); !placed.ok()) {
        return absl::InvalidArgumentError(absl::StrReplaceAll(
            placed.message(), {{"worker.image_edit.", absl::StrCat("algorithm.", name, ".")}}));
      }
      DRAY_RETURN_IF_ERROR(
          TrainingShardingError(ScoreModelConfig(*sharding), absl::StrCat("algorithm.", name)));
    }
  }
  if (name == "flow_grpo_fast" && sde_window_size < 1)
    return bad("algorithm.sde_window_size",
               "must be at least 1 for flow_grpo_fast, which trains a window of SDE steps");
  if (name == "grpo_guard" && loss != "grpo" && loss != "grpo_guard")
    return bad("algorithm.loss", absl::StrCat("'", loss,
                                              "' cannot go with algorithm.name grpo_guard, "
                                              "whose loss is grpo_guard"));
  if (!(clip_range > 0)) return bad("algorithm.clip_range", "must be > 0");
  if (!(adv_clip_max > 0)) return bad("algorithm.adv_clip_max", "must be > 0");
  if (!(beta >= 0)) return bad("algorithm.beta", "must be >= 0");
  if (!(timestep_fraction > 0 && timestep_fraction <= 1))
    return bad("algorithm.timestep_fraction", "must lie in (0, 1]");
  if (num_inner_epochs < 1) return bad("algorithm.num_inner_epochs", "must be at least 1");
  if (!(noise_level >= 0)) return bad("algorithm.noise_level", "must be >= 0");
  if (!rl::ParseSdeType(sde_type).ok())
    return bad("algorithm.sde_type", "must be sde, cps or dance");
  if (num_inference_steps < 2)
    return bad("worker.rollout.num_inference_steps", "must be at least 2");
  if (sde_window_size < 0 || sde_window_size >= num_inference_steps)
    return bad("algorithm.sde_window_size",
               absl::StrCat("must lie in [0, ", num_inference_steps - 1, "]"));
  if (sde_window_range.size() != 2 || sde_window_range[0] < 0 ||
      sde_window_range[1] < sde_window_range[0] || sde_window_range[1] > num_inference_steps)
    return bad("algorithm.sde_window_range",
               absl::StrCat("must be [lo, hi] with 0 <= lo <= hi <= ", num_inference_steps));
  if (!(lr > 0)) return bad("worker.actor.lr", "must be > 0");
  if (lr_warmup_steps < 0) return bad("worker.actor.lr_warmup_steps", "must be >= 0");
  if (!(weight_decay >= 0)) return bad("worker.actor.weight_decay", "must be >= 0");
  if (!(max_grad_norm > 0)) return bad("worker.actor.max_grad_norm", "must be > 0");
  if (micro_batch_size < 1) return bad("worker.actor.micro_batch_size", "must be at least 1");
  if (lora_rank < 0) return bad("worker.actor.lora_rank", "must be >= 0 (0: full fine-tuning)");
  if (lora_rank > 0 && lora_target_modules.empty())
    return bad("worker.actor.lora_target_modules", "must name at least one module");
  if (resolution < 16 || resolution % 16 != 0)
    return bad("worker.rollout.resolution", "must be a multiple of 16, at least 16");
  if (reward_functions.empty() && remote_rewards.empty() && !paired())
    return bad("worker.reward.functions", "must name at least one (or a remote scorer)");
  if (reward_placement != "controller" && reward_placement != "colocated" &&
      reward_placement != "separate")
    return bad("worker.reward.placement", "must be controller, colocated or separate");
  if (reward_workers < 1 || reward_workers > 4096)
    return bad("worker.reward.num_workers", "must lie in [1, 4096]");
  std::set<std::string> names(reward_functions.begin(), reward_functions.end());
  for (const RemoteRewardConfig& remote : remote_rewards) {
    const std::string where = absl::StrCat("worker.reward.remote '", remote.name, "'");
    if (!names.insert(remote.name).second)
      return bad(where.c_str(), "has the name of another scorer or function: names must differ");
    const size_t colon = remote.address.rfind(':');
    if (remote.address.find("://") != std::string::npos || colon == std::string::npos ||
        colon + 1 == remote.address.size() ||
        remote.address.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
      return bad(where.c_str(),
                 absl::StrCat("address '", remote.address, "' must be host:port (no scheme)"));
    }
    if (!std::isfinite(remote.weight)) return bad(where.c_str(), "weight must be a number");
    if (remote.timeout_ms < 1) return bad(where.c_str(), "timeout_ms must be at least 1");
    if (remote.max_batch < 1) return bad(where.c_str(), "max_batch must be at least 1");
    if (remote.max_retries < 0) return bad(where.c_str(), "max_retries must be >= 0");
  }
  for (const std::string& name : reward_functions) {
    if (!FindRewardFunction(name).ok())
      return bad("worker.reward.functions",
                 absl::StrCat("'", name, "' is not registered (registered: ",
                              absl::StrJoin(RewardFunctionNames(), ", "), ")"));
  }
  if (reward_weights.size() != reward_functions.size())
    return bad("worker.reward.weights",
               absl::StrCat("must have one weight per function (", reward_functions.size(), ")"));
  if (total_steps < 1) return bad("trainer.total_steps", "must be at least 1");
  if (save_dir.empty()) return bad("trainer.save_dir", "must be a directory");
  if (seed < 0) return bad("trainer.seed", "must be >= 0");
  if (log_every < 1) return bad("trainer.log_every", "must be at least 1");
  if (sample_every < 1) return bad("trainer.sample_every", "must be at least 1");
  if (on_nan != "stop" && on_nan != "skip") return bad("trainer.on_nan", "must be stop or skip");
  if (save_every < 0) return bad("trainer.save_every", "must be >= 0 (0: no checkpoints)");
  if (keep_last < 1) return bad("trainer.keep_last", "must be at least 1");
  if (resume.empty()) return bad("trainer.resume", "must be never, auto or a checkpoint directory");
  if (max_restarts < 0) return bad("trainer.max_restarts", "must be >= 0");
  if (max_staleness < 0) return bad("trainer.max_staleness", "must be >= 0 (steps)");
  if (!(rollout_is_threshold >= 1))
    return bad("algorithm.rollout_is_threshold", "must be at least 1");
  if (rollout_workers < 1) return bad("worker.rollout.num_workers", "must be at least 1");
  if (async_rollout && !grpo())
    return bad("trainer.async",
               absl::StrCat("applies to the GRPO algorithms (", AlgorithmNames(/*grpo_only=*/true),
                            "), whose rollouts' log-probabilities it corrects for"));
  if (async_rollout && max_staleness < 1)
    return bad("trainer.max_staleness",
               "must be at least 1 with trainer.async (0 is synchronous: trainer.async false)");
  return absl::OkStatus();
}

absl::Status TrainConfig::CheckFamily(ModelFamily family) const {
  if (family != ModelFamily::kFluxKontext) return absl::OkStatus();
  auto unimplemented = [&](const std::string& what) {
    return absl::UnimplementedError(absl::StrCat(
        model.model_path,
        " is FLUX.1 Kontext: dray trains it with SFT, the GRPO family, "
        "DiffusionNFT and DPO, with LoRA or with full fine-tuning without a frozen reference; ",
        what, " runs Qwen-Image-Edit models only"));
  };
  if (vae()) return unimplemented("algorithm.name vae");
  if (dmd2()) return unimplemented("algorithm.name dmd2");
  if (frozen_reference()) {
    return unimplemented(
        absl::StrCat("full fine-tuning (worker.actor.lora_rank 0) with a frozen reference copy (",
                     dpo() ? "DPO without algorithm.ref_update_step" : "algorithm.beta > 0", ")"));
  }
  return absl::OkStatus();
}

namespace {

// KontextTrainDefaults: what flow_grpo's FLUX.1 Kontext script (its
// counting_flux_kontext config) chooses where dray's generic defaults
// differ: its LoRA (rank 64, alpha 128, FLUX.1's attention and MLP
// layers), embedded guidance 2.5, and T5 prompts of at most 128 tokens;
// and FluxKontextPipeline's own defaults for the rest of the model's keys.
void KontextTrainDefaults(TrainConfig& c) {
  c.model.UseKontextDefaults();
  c.model.guidance_scale = 2.5;
  c.model.max_prompt_tokens = 128;
  c.lora_rank = 64;
  c.lora_alpha = 128;
  c.lora_target_modules = flux::DiffusersLoraTargets();
  c.lora_target_modules.push_back("proj_mlp");
}

}  // namespace

absl::StatusOr<TrainConfig> TrainConfig::Load(const std::string& yaml_path,
                                              const std::vector<std::string>& overrides) {
  YAML::Node document;
  if (!yaml_path.empty()) {
    DRAY_ASSIGN_OR_RETURN(document, ParseYaml(yaml_path, /*is_path=*/true));
  }
  auto read = [&](TrainConfig config) -> absl::StatusOr<TrainConfig> {
    DRAY_RETURN_IF_ERROR(ApplyYaml(document, yaml_path, Keys(config)));
    for (const std::string& text : overrides)
      DRAY_RETURN_IF_ERROR(ApplyOverride(text, Keys(config)));
    return config;
  };
  // What was asked picks the defaults the file and overrides then apply to:
  // the embedded task's, or any data's on the embedded tiny model (its
  // sizes), and the algorithm's own.
  DRAY_ASSIGN_OR_RETURN(const TrainConfig asked, read(TrainConfig()));
  TrainConfig defaults;
  if (asked.embedded_task() || asked.model.model_path.empty())
    defaults = EmbeddedDefaults(asked.name, asked.embedded_task());
  const ModelFamily family = asked.model.family();
  if (family == ModelFamily::kFluxKontext) KontextTrainDefaults(defaults);
  if (asked.name == "flow_grpo_fast") defaults.sde_window_size = 2;  // flow_grpo's default
  if (asked.name == "mix_grpo") {  // MixGRPO's script: a window of 4, DanceGRPO's advantages
    defaults.sde_window_size = 4;
    defaults.adv_estimator = "dance_grpo";
  }
  if (asked.name == "dpo") {  // flow_grpo's DPO config's beta; data's edits scored only if asked
    defaults.beta = 100;
    if (asked.embedded_task()) defaults.dpo_pairs = "samples";  // flow_grpo's online pairs
    if (!asked.embedded_task() && asked.dpo_pairs == "data") {
      defaults.reward_functions = {};
      defaults.reward_weights = {};
    }
  }
  if (asked.nft()) {  // DiffusionNFT's config: its KL weight and timesteps, no CFG
    defaults.beta = 1e-4;
    defaults.timestep_fraction = 0.99;
    defaults.model.negative_prompt = "";
  }
  if (asked.name == "dance_grpo") {  // DanceGRPO's Qwen-Image-Edit script: its step, no CFG
    defaults.sde_type = "dance";
    defaults.adv_estimator = "dance_grpo";
    defaults.noise_level = 0.3;
    defaults.timestep_fraction = 0.6;
    defaults.model.negative_prompt = "";
  }
  DRAY_ASSIGN_OR_RETURN(TrainConfig config, read(defaults));
  // Flow-GRPO-Fast's window within the schedule's first half unless placed,
  // as flow_grpo's configs put it (e.g. within (0, 5) of 10 steps).
  if (config.name == "flow_grpo_fast" && config.sde_window_range == std::vector<int64_t>{0, 0})
    config.sde_window_range = {0, config.num_inference_steps / 2};
  DRAY_RETURN_IF_ERROR(ForeignKeyError(config, family, KeysSetIn(document, overrides)));
  DRAY_RETURN_IF_ERROR(config.CheckFamily(family));  // what the model cannot run, first
  DRAY_RETURN_IF_ERROR(config.Validate());
  DRAY_RETURN_IF_ERROR(config.model.CheckFamily(family));
  return config;
}

absl::StatusOr<TrainConfig> TrainConfig::FromYaml(const std::string& text) {
  DRAY_ASSIGN_OR_RETURN(YAML::Node document, ParseYaml(text, /*is_path=*/false));
  TrainConfig config;
  DRAY_RETURN_IF_ERROR(ApplyYaml(document, "config", Keys(config)));
  DRAY_RETURN_IF_ERROR(config.Validate());
  return config;
}

std::string TrainConfig::ToYaml() const {
  // Every key but other algorithms' own and those this one does not read,
  // so that the file loads back.
  TrainConfig copy = *this, owned = *this;
  std::set<std::string> foreign;
  for (const OwnedKeys& keys : OwnKeys(owned)) {
    if (IsOwner(keys, name)) continue;
    for (const ConfigKey& key : keys.keys) foreign.insert(key.key);
  }
  for (const auto& [key, why] : UnreadKeys(*this, model.family())) foreign.insert(key);
  std::vector<ConfigKey> keys;
  for (ConfigKey& key : Keys(copy)) {
    if (foreign.count(key.key) == 0) keys.push_back(std::move(key));
  }
  return KeysToYaml(keys);
}

}  // namespace dray
