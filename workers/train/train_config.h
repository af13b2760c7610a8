// TrainConfig: a training job's configuration (Flow-GRPO, SFT or the VAE), in verl/EasyR1's
// YAML layout with dotted command-line overrides:
//
//   data:      train_files (JSONL rows {"image", "instruction", ...}; SFT and
//              VAE: and "target"; DPO: "chosen" and "rejected"), prompts_per_step
//   algorithm: name (grpo, flow_grpo_fast, grpo_guard, mix_grpo, dance_grpo,
//              diffusion_nft, sft, dpo or vae),
//              adv_estimator, loss, group_size, global_std, clip_range,
//              adv_clip_max, beta, timestep_fraction, num_inner_epochs,
//              noise_level, sde_type, sde_window_size, sde_window_range;
//              MixGRPO's: sample_strategy, iters_per_group, prog_overlap,
//              prog_overlap_step, roll_back, max_iters_per_group,
//              min_iters_per_group, kl_coeff, trimmed_ratio,
//              multi_reward_mix, init_same_noise; DanceGRPO's:
//              shift, init_same_noise; DPO's: dpo_pairs, ref_update_step;
//              DiffusionNFT's:
//              nft_beta, decay_type, adv_mode, solver; DMD2's:
//              num_denoising_step, backward_simulation,
//              real_guidance_scale, min_step_percent, max_step_percent,
//              dm_loss_weight, guidance_lr, dfake_gen_update_ratio,
//              real_score.{fsdp_sharding_strategy, torch_dtype},
//              fake_score.{fsdp_sharding_strategy, torch_dtype},
//              cls_on_clean_image, gen_cls_loss, gen_cls_loss_weight,
//              guidance_cls_loss_weight, diffusion_gan, diffusion_gan_max_timestep
//   worker.image_edit: the model and its sharding (workers/pipeline/edit_config.h)
//   worker.actor:   lr, lr_warmup_steps, weight_decay, max_grad_norm, micro_batch_size,
//                   lora_rank (0: full fine-tuning), lora_alpha, lora_target_modules,
//                   gradient_checkpointing
//   worker.rollout: num_inference_steps, resolution
//   worker.reward:  functions, weights, placement, num_workers, remote (scorers over gRPC:
//                   [{name, address, weight, timeout_ms, max_batch, max_retries,
//                     tls_ca, token_env}])
//   trainer:   total_steps, save_dir, seed, log_every, sample_every, on_nan,
//              save_every, keep_last, resume, max_restarts
//   cluster:   nodes, listen, token_file, tls_cert, tls_key, tls_ca, tls_mutual
//              (workers/config/cluster_config.h; the flags of the same names win)
//
//   DRAY_ASSIGN_OR_RETURN(TrainConfig config,
//                         TrainConfig::Load("job.yaml", {"worker.actor.lr=3e-4"}));
//   std::cout << config.ToYaml();  // the resolved configuration
//
// With no train_files, the job is the embedded task (a colour-naming edit
// task, or SFT's synthetic pairs, on the embedded tiny model); with no
// model_path, the embedded tiny model. Either way, keys a file and
// overrides leave unset default to what suits the tiny model
// (EmbeddedDefaults: 64-pixel images, a few steps). An unknown key, a
// wrong type, an out-of-range value, a key of another algorithm than
// algorithm.name's (MixGRPO's, DanceGRPO's, DPO's own keys) or one the job
// would not read (serving's worker.image_edit keys, the other model
// family's) is INVALID_ARGUMENT naming the key and why.
#ifndef DRAY_WORKERS_TRAIN_TRAIN_CONFIG_H_
#define DRAY_WORKERS_TRAIN_TRAIN_CONFIG_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "workers/config/cluster_config.h"
#include "workers/pipeline/edit_config.h"
#include "workers/rl/mix_grpo_window.h"

namespace dray {

// RemoteRewardConfig: one scorer of worker.reward.remote, a
// dray.v1.RewardService (proto/dray/v1/reward.proto) at `address`.
struct RemoteRewardConfig {
  std::string name;     // logged as reward/<name>
  std::string address;  // host:port
  double weight = 1.0;
  int64_t timeout_ms = 60000;  // each call's deadline
  int64_t max_batch = 32;      // rows per call
  int64_t max_retries = 2;     // more attempts of a failed call
  std::string tls_ca;          // a PEM CA bundle: call over TLS (empty: plaintext)
  std::string token_env;       // an environment variable holding a bearer token

  friend bool operator==(const RemoteRewardConfig& a, const RemoteRewardConfig& b) {
    return a.name == b.name && a.address == b.address && a.weight == b.weight &&
           a.timeout_ms == b.timeout_ms && a.max_batch == b.max_batch &&
           a.max_retries == b.max_retries && a.tls_ca == b.tls_ca && a.token_env == b.token_env;
  }
};

// Algorithm: one of algorithm.name's choices, the name its authors use
// (`title`), and whether it is a GRPO algorithm (SDE rollouts, group
// advantages, a clipped surrogate).
struct Algorithm {
  const char* name;
  const char* title;
  bool grpo;
};
inline constexpr Algorithm kAlgorithms[] = {{"grpo", "Flow-GRPO", true},
                                            {"flow_grpo_fast", "Flow-GRPO-Fast", true},
                                            {"grpo_guard", "GRPO-Guard", true},
                                            {"mix_grpo", "MixGRPO", true},
                                            {"dance_grpo", "DanceGRPO", true},
                                            {"diffusion_nft", "DiffusionNFT", false},
                                            {"dmd2", "DMD2", false},
                                            {"sft", "SFT", false},
                                            {"dpo", "Diffusion-DPO", false},
                                            {"vae", "VAE training", false}};

// FindAlgorithm: kAlgorithms' entry named `name`, or nullptr.
const Algorithm* FindAlgorithm(const std::string& name);
// AlgorithmNames lists the names ("grpo, ... or vae"; `grpo_only`: the
// GRPO algorithms'), as errors name them.
std::string AlgorithmNames(bool grpo_only = false);

struct TrainConfig {
  // data.*
  std::string train_files;  // a JSONL file; empty: the embedded task
  int64_t prompts_per_step = 8;

  // algorithm.*
  // "grpo", "flow_grpo_fast" (GRPO on a window of sde_window_size SDE
  // steps, 2 unless set, within the schedule's first half unless
  // sde_window_range is set, the rest ODE: flow_grpo's Flow-GRPO-Fast),
  // "grpo_guard" (GRPO with GRPO-Guard's loss, flow_grpo's config.rationorm),
  // "mix_grpo" (GRPO on MixGRPO's sliding window of sde_window_size SDE
  // steps, 4 unless set, moved as `mix_window` says; DanceGRPO's advantages
  // unless adv_estimator is set), "dance_grpo" (GRPO as DanceGRPO runs it:
  // its step and shifted schedule, every step stochastic, a group's samples
  // from one initial noise, int((steps - 1) timestep_fraction) steps
  // trained, a subset of its own per sample, no CFG),
  // "sft" (supervised flow matching on paired data), "dpo" (Diffusion-DPO:
  // on the pairs of rows with a "chosen" and a "rejected" edit, or with
  // dpo_pairs "samples" on the best and the worst of each prompt's
  // group_size samples by reward, as flow_grpo's DPO; beta its beta,
  // int(num_inference_steps x timestep_fraction) noise draws per pair and
  // step), "diffusion_nft" (DiffusionNFT: deterministic rollouts of a
  // sampling policy that trails the trained one, rewards and group
  // advantages as GRPO's, and its negative-aware loss on each sample's
  // clean latents noised afresh at int(num_inference_steps x
  // timestep_fraction) of the schedule's timesteps, its own per sample; no
  // CFG), "dmd2" (DMD2: a few-step generator distilled from the model,
  // the real score, with a fake score trained beside it; no rewards) or
  // "vae" (the VAE as an autoencoder on the paired rows' images and
  // targets).
  std::string name = "grpo";
  std::string adv_estimator = "grpo";  // workers/rl/advantages.h
  std::string loss = "grpo";           // workers/rl/policy_loss.h
  int64_t group_size = 4;              // samples per prompt
  bool global_std = true;
  double clip_range = 1e-4;
  double adv_clip_max = 5.0;
  // KL weight: to the reference policy (LoRA: adapters off); vae: of the
  // latent distribution to N(0, 1) (a beta-VAE's beta).
  double beta = 0.0;
  double timestep_fraction = 1.0;  // share of the SDE window's steps trained
  int64_t num_inner_epochs = 1;    // optimizer steps on each rollout batch
  double noise_level = 0.7;        // eta inside the SDE window
  std::string sde_type = "sde";    // or "cps"
  int64_t sde_window_size = 0;     // 0: every step but the last is stochastic
  std::vector<int64_t> sde_window_range = {
      0, 0};  // where a window may start and end; {0, 0}: anywhere
  // mix_grpo's: how its window moves (its size and end are sde_window_size
  // and num_inference_steps - 2), the weight of its log-probability penalty
  // (workers/rl/policy_loss.h) and the share of each group's lowest rewards
  // its advantages' statistics leave out (workers/rl/advantages.h).
  rl::MixGrpoWindowOptions mix_window;
  double kl_coeff = 0.0;
  double trimmed_ratio = 0.0;
  // How several rewards make advantages: summed first ("reward_aggr") or
  // each one's advantages weighted and summed ("advantage_aggr",
  // rl::MixedAdvantages), MixGRPO's multi_reward_mix.
  std::string multi_reward_mix = "reward_aggr";
  // dance_grpo's: its schedule's shift (DanceGrpoSchedule); dance_grpo's
  // and mix_grpo's: whether a group's samples start from one initial noise.
  double shift = 3.0;
  bool init_same_noise = true;
  // dpo's: "data" (the rows' chosen and rejected edits) or "samples"; and
  // ref_update_step, flow_grpo's: N > 0 makes the reference a copy of the
  // policy refreshed every N steps, which also samples the pairs (its
  // OnlineDPO); 0: the base model is the reference, the policy samples.
  std::string dpo_pairs = "data";
  int64_t ref_update_step = 0;
  // diffusion_nft's: its beta (how far its implicit positive and negative
  // policies lie from the sampling policy: its config.beta, while `beta`
  // stays the KL weight, its train.beta), how the sampling policy follows
  // the trained one (rl::NftOldPolicyDecay's decay_type), which advantages
  // it learns from (rl::NftLossOptions::adv_mode) and its rollouts' ODE
  // solver (rl::OdeSolver: flow or dpm2).
  double nft_beta = 1.0;
  int64_t decay_type = 1;
  std::string adv_mode = "all";
  std::string solver = "dpm2";
  // dmd2's, by DMD2's own names (workers/rl/dmd2.h): the generator's
  // steps (num_denoising_step of the model's own schedule, as `dray edit
  // --steps N` runs them), trained on inputs of its own making
  // (backward_simulation) or on each step's pure noise; the real score's
  // guidance; the noise levels of the distribution-matching loss
  // (min_step_percent .. max_step_percent of the 1000 train timesteps) and
  // its weight; the fake score's learning rate and its updates per
  // generator update (dfake_gen_update_ratio: the generator learns every
  // N-th step).
  int64_t num_denoising_step = 4;
  bool backward_simulation = true;
  double real_guidance_scale = 4.0;
  double min_step_percent = 0.02;
  double max_step_percent = 0.98;
  double dm_loss_weight = 1.0;
  double guidance_lr = 1e-4;
  int64_t dfake_gen_update_ratio = 5;
  // dmd2's score models' placement: each one's FSDP strategy and dtype
  // (worker.image_edit's fsdp_sharding_strategy and torch_dtype; empty:
  // the model's). The real score's applies where it is a copy: with LoRA
  // it is the generator's own frozen base.
  struct ScoreModelSharding {
    std::string fsdp_sharding_strategy;
    std::string torch_dtype;
  };
  ScoreModelSharding real_score, fake_score;
  // dmd2's GAN (DMD2's names): a classifier head on the fake score's
  // features (workers/train/dmd2_classifier.h) tells the data's targets
  // ("target" in every row: the real images) from the generator's samples,
  // trained with the fake score at guidance_cls_loss_weight; the generator
  // learns to pass for real at gen_cls_loss_weight (with gen_cls_loss);
  // with diffusion_gan, both are noised at a train timestep below
  // diffusion_gan_max_timestep first. The weights are DMD2's SDXL recipe's.
  bool cls_on_clean_image = false;
  bool gen_cls_loss = true;
  double gen_cls_loss_weight = 5e-3;
  double guidance_cls_loss_weight = 1e-2;
  bool diffusion_gan = false;
  int64_t diffusion_gan_max_timestep = 0;
  // ScoreModelConfig: worker.image_edit as `sharding` places a score model.
  ImageEditConfig ScoreModelConfig(const ScoreModelSharding& sharding) const {
    ImageEditConfig config = model;
    if (!sharding.fsdp_sharding_strategy.empty())
      config.fsdp_sharding_strategy = sharding.fsdp_sharding_strategy;
    if (!sharding.torch_dtype.empty()) config.torch_dtype = sharding.torch_dtype;
    return config;
  }

  // worker.image_edit.*: the model, its sharding and guidance.
  ImageEditConfig model;

  // worker.actor.*
  double lr = 1e-4;
  int64_t lr_warmup_steps = 0;  // linear warm-up, then constant
  double weight_decay = 1e-4;
  double max_grad_norm = 1.0;
  int64_t micro_batch_size = 2;  // rows per forward/backward on a worker
  int64_t lora_rank = 32;        // 0: full fine-tuning of the transformer
  double lora_alpha = 64;
  std::vector<std::string> lora_target_modules = {"to_q",
                                                  "to_k",
                                                  "to_v",
                                                  "to_out.0",
                                                  "add_q_proj",
                                                  "add_k_proj",
                                                  "add_v_proj",
                                                  "to_add_out",
                                                  "img_mlp.net.0.proj",
                                                  "img_mlp.net.2",
                                                  "txt_mlp.net.0.proj",
                                                  "txt_mlp.net.2"};
  // Recompute each transformer block in backward instead of keeping its
  // activations (verl's enable_gradient_checkpointing): what a 12B model
  // needs to train on 24 GB cards (docs/memory_plan.md).
  bool gradient_checkpointing = false;

  // worker.rollout.*
  int64_t num_inference_steps = 10;
  // GRPO's outputs are resolution x resolution; SFT trains each pair at
  // about resolution^2 pixels at its aspect ratio; the VAE at resolution^2.
  int64_t resolution = 512;
  // trainer.async: the rollout group's processes (num_workers), apart from
  // the trained model's.
  int64_t rollout_workers = 1;

  // worker.reward.*
  std::vector<std::string> reward_functions = {"color"};  // workers/train/rewards.h
  std::vector<double> reward_weights = {1.0};
  std::vector<RemoteRewardConfig> remote_rewards;  // worker.reward.remote
  // Where the functions run: "controller", "colocated" (the reward role in
  // the model's worker processes) or "separate" (reward_workers processes).
  std::string reward_placement = "controller";
  int64_t reward_workers = 1;

  // trainer.*
  int64_t total_steps = 100;
  std::string save_dir = "dray_train";
  int64_t seed = 0;
  int64_t log_every = 1;
  int64_t sample_every = 10;
  std::string on_nan = "stop";  // or "skip": a step whose loss is not finite
  int64_t save_every = 0;       // a checkpoint every N steps (and after the last); 0: none
  int64_t keep_last = 2;        // checkpoints kept (the newest)
  std::string resume =
      "never";               // "auto": from the newest checkpoint in save_dir; or a checkpoint dir
  int64_t max_restarts = 0;  // times a failed worker group is restarted from the last checkpoint
  // trainer.async: a rollout group of its own samples step k + 1 while the
  // model's workers update step k (verl-omni's separate_async), with
  // weights at most max_staleness steps old (synced when they would be
  // older); the update weighs each sample by its importance ratio against
  // the behaviour policy that sampled it, truncated at
  // rollout_is_threshold (verl's decoupled rollout correction).
  bool async_rollout = false;
  int64_t max_staleness = 1;
  double rollout_is_threshold = 2.0;

  // cluster.*
  ClusterConfig cluster;

  // Load reads `yaml_path` (none when empty), then applies `overrides`
  // ("section.key=VALUE"), then validates.
  static absl::StatusOr<TrainConfig> Load(const std::string& yaml_path,
                                          const std::vector<std::string>& overrides);
  // FromYaml reads what ToYaml writes (how the controller hands the resolved
  // configuration to workers).
  static absl::StatusOr<TrainConfig> FromYaml(const std::string& text);
  std::string ToYaml() const;
  absl::Status Validate() const;
  // CheckFamily: whether this job can train a model of `family`
  // (FLUX.1 Kontext: not the VAE, DMD2, or a full fine-tune's frozen
  // reference copy): UNIMPLEMENTED naming what it cannot.
  absl::Status CheckFamily(ModelFamily family) const;

  bool embedded_task() const { return train_files.empty(); }
  // grpo: a GRPO algorithm (grpo, flow_grpo_fast, grpo_guard, mix_grpo,
  // dance_grpo): rollouts,
  // rewards, advantages and a policy loss.
  bool grpo() const {
    const Algorithm* algorithm = FindAlgorithm(name);
    return algorithm != nullptr && algorithm->grpo;
  }
  bool sft() const { return name == "sft"; }
  bool vae() const { return name == "vae"; }
  bool dpo() const { return name == "dpo"; }
  bool nft() const { return name == "diffusion_nft"; }
  bool dmd2() const { return name == "dmd2"; }
  // sampling_policy: whether the workers keep a second copy of the trained
  // weights that samples the rollouts (DiffusionNFT's sampling policy,
  // DPO's refreshed reference).
  bool sampling_policy() const { return nft() || (dpo() && ref_update_step > 0); }
  // paired: the job reads pairs (image and target; DPO on data: and the
  // rejected edit) and needs no rewards (DPO scores its edits with any it
  // names); the others roll out samples and score them.
  bool paired() const { return sft() || vae() || (dpo() && dpo_pairs == "data"); }
  // frozen_reference: whether the workers keep a frozen copy of the initial
  // transformer (full fine-tuning with a KL term, DPO's fixed reference,
  // DMD2's real score); LoRA's reference is the model with its adapters off.
  bool frozen_reference() const {
    return lora_rank == 0 && (dmd2() || (dpo() ? !sampling_policy() : !paired() && beta > 0));
  }
  // dpo_draws: DPO's noise draws per pair and step (flow_grpo's
  // num_train_timesteps).
  int64_t dpo_draws() const {
    return std::max<int64_t>(1, static_cast<int64_t>(num_inference_steps * timestep_fraction));
  }
  // policy_loss: the loss GRPO trains with (grpo_guard's own for it).
  std::string policy_loss() const { return name == "grpo_guard" ? "grpo_guard" : loss; }
  // MixWindow: mix_grpo's window options, sized and bounded by this job.
  rl::MixGrpoWindowOptions MixWindow() const {
    rl::MixGrpoWindowOptions options = mix_window;
    options.size = sde_window_size;
    options.max_timesteps = num_inference_steps - 2;
    return options;
  }
  // rows_per_step: samples per step, prompts_per_step x group_size (SFT
  // and VAE: prompts_per_step pairs; DMD2: prompts_per_step rows).
  int64_t rows_per_step() const { return prompts_per_step * (paired() || dmd2() ? 1 : group_size); }
};

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_TRAIN_CONFIG_H_
