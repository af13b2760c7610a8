// TrainConfig, training data and reward functions: what a user gets wrong is
// an error naming the key, file and line, or row; the built-in rewards score
// what they say they score.
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "base/files.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "workers/image/image_codec.h"
#include "workers/train/rewards.h"
#include "workers/train/train_config.h"
#include "workers/train/train_data.h"

namespace dray {
namespace {

namespace fs = std::filesystem;
using ::dray::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(TrainConfigTest, TheEmbeddedTaskFillsWhatIsUnset) {
  DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig config, TrainConfig::Load("", {"trainer.total_steps=7"}));
  EXPECT_TRUE(config.embedded_task());
  EXPECT_EQ(config.total_steps, 7);
  EXPECT_EQ(config.resolution, 64);
  DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig again, TrainConfig::FromYaml(config.ToYaml()));
  EXPECT_EQ(again.ToYaml(), config.ToYaml());
  EXPECT_THAT(config.ToYaml(), HasSubstr("lora_target_modules:"));
}

TEST(TrainConfigTest, EachAlgorithmGetsALearningRateThatImprovesTheEmbeddedModel) {
  // SFT and the VAE start from weights fitted to the embedded pairs: 3e-2
  // made both diverge there (SFT's loss 0.2 -> 15 in 10 steps); GRPO at
  // 1e-2 collapses the embedded task (trainer_test.cc).
  for (const auto& [algorithm, lr] :
       std::vector<std::pair<std::string, double>>{{"grpo", 3e-3}, {"sft", 1e-3}, {"vae", 1e-4}}) {
    DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig config,
                              TrainConfig::Load("", {"algorithm.name=" + algorithm}));
    EXPECT_EQ(config.lr, lr) << algorithm;
  }
  DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig set,
                            TrainConfig::Load("", {"algorithm.name=sft", "worker.actor.lr=0.5"}));
  EXPECT_EQ(set.lr, 0.5);
}

TEST(TrainConfigTest, ErrorsInAFileNameItsLine) {
  EXPECT_THAT(TrainConfig::FromYaml("trainer:\n  total_steps: 3\n  seed: many\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("config: line 3: trainer.seed must be an integer")));
  EXPECT_THAT(TrainConfig::FromYaml("trainer:\n  total_steps: 3\nalgorithm:\n  bta: 0.1\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("config: line 4: unknown key algorithm.bta")));
}

TEST(TrainConfigTest, BadKeysAndValuesNameTheKey) {
  EXPECT_THAT(TrainConfig::Load("", {"worker.actor.learning_rate=1"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown key worker.actor.learning_rate; valid keys: lr,")));
  EXPECT_THAT(TrainConfig::Load("", {"trainer.total_steps=many"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("trainer.total_steps must be an integer")));
  EXPECT_THAT(TrainConfig::Load("", {"algorithm.adv_estimator=dance"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("registered: dance_grpo, global, grpo")));
  EXPECT_THAT(
      TrainConfig::Load("", {"worker.reward.functions=[color, beauty]"}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'beauty' is not registered")));
  EXPECT_THAT(TrainConfig::Load("", {"worker.reward.weights=[1, 2]"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one weight per function")));
  EXPECT_THAT(
      TrainConfig::Load("", {"algorithm.beta=-1"}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("algorithm.beta must be >= 0")));
  EXPECT_THAT(TrainConfig::Load("", {"algorithm.sde_window_size=8"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("algorithm.sde_window_size")));
}

TEST(TrainConfigTest, MixGrpoKeysBelongToMixGrpo) {
  // MixGRPO: a window of 4 unless set, DanceGRPO's advantages, its window
  // options checked; its keys are errors under another algorithm.
  DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig mix, TrainConfig::Load("", {"algorithm.name=mix_grpo"}));
  EXPECT_EQ(mix.sde_window_size, 4);
  EXPECT_EQ(mix.adv_estimator, "dance_grpo");
  EXPECT_EQ(mix.MixWindow().max_timesteps, mix.num_inference_steps - 2);
  DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig again, TrainConfig::FromYaml(mix.ToYaml()));
  EXPECT_EQ(again.mix_window.iters_per_group, mix.mix_window.iters_per_group);
  EXPECT_THAT(TrainConfig::Load("", {"algorithm.iters_per_group=5"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("algorithm.iters_per_group is mix_grpo's")));
  EXPECT_THAT(TrainConfig::Load("", {"algorithm.name=flow_grpo_fast", "algorithm.kl_coeff=0.01"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("algorithm.kl_coeff")));
  EXPECT_THAT(
      TrainConfig::Load("", {"algorithm.name=mix_grpo", "algorithm.sample_strategy=sweep"}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("algorithm.sample_strategy 'sweep'")));
  EXPECT_THAT(TrainConfig::Load("", {"algorithm.name=mix_grpo", "algorithm.sde_window_size=7"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("algorithm.sde_window_size")));
  EXPECT_THAT(TrainConfig::Load("", {"algorithm.name=mix_grpo", "algorithm.trimmed_ratio=1"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("algorithm.trimmed_ratio")));
  EXPECT_THAT(
      TrainConfig::Load("", {"algorithm.name=mix_grpo", "algorithm.sde_window_range=[0,3]"}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("algorithm.sde_window_range")));
  EXPECT_THAT(
      TrainConfig::Load("", {"algorithm.name=mix_grpo", "algorithm.multi_reward_mix=max"}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("algorithm.multi_reward_mix")));
}

TEST(TrainConfigTest, TheResolvedConfigurationLoadsBackForEveryAlgorithm) {
  // config.yaml holds every key but other algorithms' own: loaded back as a
  // file, it is the same job.
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/resolved.yaml";
  for (const std::string name :
       {"grpo", "mix_grpo", "dance_grpo", "dpo", "diffusion_nft", "sft", "dmd2"}) {
    SCOPED_TRACE(name);
    DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig config,
                              TrainConfig::Load("", {"algorithm.name=" + name}));
    ASSERT_TRUE(WriteFile(path, config.ToYaml()).ok());
    DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig again, TrainConfig::Load(path, {}));
    EXPECT_EQ(again.ToYaml(), config.ToYaml());
  }
}

TEST(TrainConfigTest, DpoTakesFlowGrpoBetaAndScoresOnlyWhenAsked) {
  // The embedded task: pairs from the policy's own samples, by its reward.
  DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig dpo, TrainConfig::Load("", {"algorithm.name=dpo"}));
  EXPECT_EQ(dpo.dpo_pairs, "samples");
  EXPECT_FALSE(dpo.paired());
  EXPECT_EQ(dpo.reward_functions, std::vector<std::string>{"target_psnr"});
  EXPECT_EQ(dpo.rows_per_step(), dpo.prompts_per_step * dpo.group_size);
  EXPECT_EQ(dpo.dpo_draws(), dpo.num_inference_steps);
  EXPECT_THAT(TrainConfig::Load("", {"algorithm.name=dpo", "algorithm.dpo_pairs=best"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("algorithm.dpo_pairs")));
  EXPECT_THAT(TrainConfig::Load("", {"algorithm.dpo_pairs=data"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is dpo's")));
  EXPECT_THAT(TrainConfig::Load("", {"algorithm.ref_update_step=40"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is dpo's")));
  EXPECT_THAT(TrainConfig::Load("", {"algorithm.name=dpo", "algorithm.ref_update_step=-1"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("algorithm.ref_update_step must be >= 0")));
  EXPECT_THAT(
      TrainConfig::Load("", {"algorithm.name=dpo", "algorithm.beta=0"}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("algorithm.beta must be > 0")));
  // A dataset's pairs: no rewards unless named.
  DRAY_ASSERT_OK_AND_ASSIGN(
      dpo, TrainConfig::Load("", {"algorithm.name=dpo", "data.train_files=pairs.jsonl",
                                  "worker.image_edit.model_path=/models/qwen"}));
  EXPECT_EQ(dpo.beta, 100) << "flow_grpo's DPO configs";
  EXPECT_TRUE(dpo.paired());
  EXPECT_TRUE(dpo.reward_functions.empty());
  EXPECT_EQ(dpo.rows_per_step(), dpo.prompts_per_step);
}

TEST(TrainConfigTest, DanceGrpoRunsAsItsScriptDoes) {
  DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig dance,
                            TrainConfig::Load("", {"algorithm.name=dance_grpo"}));
  EXPECT_EQ(dance.sde_type, "dance");
  EXPECT_EQ(dance.adv_estimator, "dance_grpo");
  EXPECT_EQ(dance.noise_level, 0.3);
  EXPECT_EQ(dance.timestep_fraction, 0.6);
  EXPECT_EQ(dance.model.negative_prompt, "") << "no CFG";
  EXPECT_TRUE(dance.init_same_noise);
  DRAY_EXPECT_OK(
      TrainConfig::Load("", {"algorithm.name=mix_grpo", "algorithm.init_same_noise=false"}));
  EXPECT_THAT(TrainConfig::Load("", {"algorithm.init_same_noise=false"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("algorithm.init_same_noise is dance_grpo's or mix_grpo's: set "
                                 "algorithm.name dance_grpo or mix_grpo to use it, not grpo")));
  EXPECT_THAT(
      TrainConfig::Load("", {"algorithm.shift=2"}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("algorithm.shift is dance_grpo's: set algorithm.name dance_grpo")));
  EXPECT_THAT(
      TrainConfig::Load("", {"algorithm.name=dance_grpo", "algorithm.shift=0"}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("algorithm.shift must be > 0")));
  EXPECT_THAT(
      TrainConfig::Load("", {"algorithm.name=dance_grpo", "algorithm.sde_window_size=2"}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("does not apply to dance_grpo")));
}

TEST(TrainConfigTest, DiffusionNftRunsAsItsConfigDoes) {
  DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig nft,
                            TrainConfig::Load("", {"algorithm.name=diffusion_nft"}));
  EXPECT_EQ(nft.beta, 1e-4) << "its train.beta: the KL weight";
  EXPECT_EQ(nft.nft_beta, 1.0);
  EXPECT_EQ(nft.timestep_fraction, 0.99);
  EXPECT_EQ(nft.decay_type, 1);
  EXPECT_EQ(nft.adv_mode, "all");
  EXPECT_EQ(nft.solver, "dpm2");
  EXPECT_EQ(nft.model.negative_prompt, "") << "no CFG";
  EXPECT_FALSE(nft.grpo());
  EXPECT_FALSE(nft.paired());
  EXPECT_THAT(TrainConfig::Load("", {"algorithm.decay_type=2"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("algorithm.decay_type is diffusion_nft's")));
  EXPECT_THAT(TrainConfig::Load("", {"algorithm.name=diffusion_nft", "algorithm.noise_level=1"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("algorithm.noise_level does not apply to diffusion_nft")));
  for (const char* bad : {"algorithm.nft_beta=0", "algorithm.decay_type=3",
                          "algorithm.adv_mode=best", "algorithm.solver=dpm3"}) {
    SCOPED_TRACE(bad);
    const std::string key = std::string(bad).substr(0, std::string(bad).find('='));
    EXPECT_THAT(TrainConfig::Load("", {"algorithm.name=diffusion_nft", bad}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(key)));
  }
}

TEST(TrainConfigTest, Dmd2DistilsTheGuidedEmbeddedModel) {
  DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig dmd2, TrainConfig::Load("", {"algorithm.name=dmd2"}));
  EXPECT_EQ(dmd2.num_denoising_step, 4);
  EXPECT_EQ(dmd2.real_guidance_scale, 4) << "the teacher guided";
  EXPECT_EQ(dmd2.model.negative_prompt, " ");
  EXPECT_EQ(dmd2.rows_per_step(), dmd2.prompts_per_step) << "one row per prompt";
  EXPECT_FALSE(dmd2.grpo());
  EXPECT_FALSE(dmd2.paired());
  EXPECT_THAT(TrainConfig::Load("", {"algorithm.name=dmd2", "algorithm.group_size=4"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("algorithm.group_size does not apply to dmd2")));
  EXPECT_THAT(
      TrainConfig::Load("", {"algorithm.guidance_lr=1e-3"}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("algorithm.guidance_lr is dmd2's")));
  EXPECT_THAT(TrainConfig::Load("", {"algorithm.name=dmd2", "algorithm.real_guidance_scale=4",
                                     "worker.image_edit.negative_prompt=\"\""}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative_prompt")));
  EXPECT_THAT(
      TrainConfig::Load("", {"algorithm.name=dmd2", "algorithm.real_score.torch_dtype=float32"}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("applies only where the real score is a copy")));
  EXPECT_THAT(
      TrainConfig::Load("", {"algorithm.name=dmd2", "algorithm.fake_score.torch_dtype=float16",
                             "algorithm.fake_score.fsdp_sharding_strategy=NO_SHARD",
                             "worker.image_edit.device=cuda"}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("algorithm.fake_score.fsdp_sharding_strategy NO_SHARD cannot go "
                         "with algorithm.fake_score.torch_dtype float16")));
  EXPECT_THAT(
      TrainConfig::Load("", {"algorithm.name=dmd2", "algorithm.backward_simulation=false"}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("algorithm.num_denoising_step 1")));
  for (const char* bad : {"algorithm.num_denoising_step=0", "algorithm.min_step_percent=0.99",
                          "algorithm.guidance_lr=0", "algorithm.dfake_gen_update_ratio=0",
                          "algorithm.fake_score.fsdp_sharding_strategy=WHOLE",
                          "algorithm.real_score.torch_dtype=int8"}) {
    SCOPED_TRACE(bad);
    const std::string key = std::string(bad).substr(0, std::string(bad).find('='));
    EXPECT_THAT(TrainConfig::Load("", {"algorithm.name=dmd2", bad}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(key)));
  }
}

TEST(TrainConfigTest, AsyncTrainingNamesWhatCannotBe) {
  DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig async, TrainConfig::Load("", {"trainer.async=true"}));
  EXPECT_EQ(async.max_staleness, 1);
  EXPECT_EQ(async.rollout_workers, 1);
  EXPECT_THAT(TrainConfig::Load("", {"trainer.async=true", "trainer.max_staleness=-1"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("trainer.max_staleness must be >= 0")));
  EXPECT_THAT(TrainConfig::Load("", {"trainer.async=true", "trainer.max_staleness=0"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("trainer.max_staleness")));
  EXPECT_THAT(TrainConfig::Load("", {"trainer.async=true", "algorithm.name=sft"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("trainer.async applies to the GRPO algorithms")));
  EXPECT_THAT(TrainConfig::Load("", {"trainer.async=true", "algorithm.rollout_is_threshold=0.5"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("algorithm.rollout_is_threshold must be at least 1")));
  for (const char* unread : {"trainer.max_staleness=2", "worker.rollout.num_workers=2",
                             "algorithm.rollout_is_threshold=3"}) {
    EXPECT_THAT(TrainConfig::Load("", {unread}),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("applies only with trainer.async: true")))
        << unread;
  }
}

// Serving's keys (one edit over several ranks, batches of requests, a LoRA
// file to serve) are errors in a training job, and config.yaml leaves them
// out: training shards the model on every rank and each rank edits rows of
// its own.
TEST(TrainConfigTest, ServingOnlyKeysAreRefusedAndLeftOutOfTheRunsConfig) {
  for (const char* serving :
       {"worker.image_edit.enable_fsdp=true", "worker.image_edit.enable_cpu_offload=true",
        "worker.image_edit.batch_size=4", "worker.image_edit.num_inference_steps=8",
        "worker.image_edit.seed=3", "worker.image_edit.lora_path=/tmp/lora.safetensors",
        "worker.image_edit.cfg_parallel_size=2", "worker.image_edit.ulysses_degree=2",
        "worker.image_edit.step_cache_threshold=0.1", "worker.image_edit.step_cache_warmup_steps=2",
        "worker.image_edit.max_pixels=65536"}) {
    const std::string key = std::string(serving).substr(0, std::string(serving).find('='));
    EXPECT_THAT(TrainConfig::Load("", {serving}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(key + " ")));
  }
  EXPECT_THAT(TrainConfig::Load("", {"worker.image_edit.cfg_parallel_size=2"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("training's ranks each hold rows of their own")));
  DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig config, TrainConfig::Load("", {}));
  for (const char* left_out : {"enable_fsdp:", "cfg_parallel_size:", "lora_path:", "    seed:"})
    EXPECT_THAT(config.ToYaml(), Not(HasSubstr(left_out))) << left_out;
  EXPECT_THAT(config.ToYaml(), HasSubstr("fsdp_sharding_strategy: FULL_SHARD"));
}

// What the model's family or the algorithm leaves unread is refused too,
// and config.yaml leaves it out (FLUX.1 Kontext's side: kontext_training_test).
TEST(TrainConfigTest, KeysTheModelOrAlgorithmDoesNotReadAreRefused) {
  for (const auto& [overrides, named] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"worker.image_edit.guidance_scale=5"}, "Qwen-Image models are guided by true CFG"},
           {{"worker.image_edit.max_prompt_tokens=64"}, "encodes a Qwen-Image model's prompts"},
           {{"algorithm.name=sft", "worker.image_edit.image_size=64"}, "train's sft runs"}}) {
    SCOPED_TRACE(named);
    EXPECT_THAT(TrainConfig::Load("", overrides),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(named)));
  }
  DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig grpo,
                            TrainConfig::Load("", {"worker.image_edit.image_size=48"}));
  EXPECT_EQ(grpo.model.image_size, 48);  // GRPO's inputs are resized to it
  EXPECT_THAT(grpo.ToYaml(),
              AllOf(HasSubstr("image_size: 48"), Not(HasSubstr("guidance_scale:")),
                    Not(HasSubstr("max_prompt_tokens:")), Not(HasSubstr("max_pixels:"))));
  DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig sft, TrainConfig::Load("", {"algorithm.name=sft"}));
  EXPECT_THAT(sft.ToYaml(), Not(HasSubstr("    image_size:")));
  DRAY_ASSERT_OK(TrainConfig::FromYaml(sft.ToYaml()).status());
}

TEST(TrainConfigTest, TheClusterSectionSitsBesideTheFlags) {
  DRAY_ASSERT_OK_AND_ASSIGN(
      TrainConfig config,
      TrainConfig::Load("", {"cluster.nodes=2", "cluster.listen=controller:29400",
                             "cluster.token_file=/run/secrets/token", "cluster.tls_mutual=true"}));
  EXPECT_EQ(config.cluster.nodes, 2);
  EXPECT_EQ(config.cluster.listen, "controller:29400");
  EXPECT_EQ(config.cluster.token_file, "/run/secrets/token");
  EXPECT_TRUE(config.cluster.tls_mutual);
  EXPECT_EQ(config.cluster.tls_ca, "");
  DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig again, TrainConfig::FromYaml(config.ToYaml()));
  EXPECT_EQ(again.cluster.listen, "controller:29400");
  EXPECT_THAT(
      TrainConfig::Load("", {"cluster.nodes=two"}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cluster.nodes must be an integer")));
  EXPECT_THAT(TrainConfig::Load("", {"cluster.port=1"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown key cluster.port")));
  EXPECT_THAT(TrainConfig::Load("", {"algorithm.name=ppo"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("grpo, flow_grpo_fast")));
  EXPECT_THAT(TrainConfig::Load("", {"algorithm.name=grpo_guard", "algorithm.loss=other"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("algorithm.loss")));
  DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig guard,
                            TrainConfig::Load("", {"algorithm.name=grpo_guard"}));
  EXPECT_EQ(guard.policy_loss(), "grpo_guard");
  // Flow-GRPO-Fast: a window of 2 SDE steps unless set, never none, in
  // the first half of the (embedded task's 8) steps unless placed.
  DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig fast,
                            TrainConfig::Load("", {"algorithm.name=flow_grpo_fast"}));
  EXPECT_EQ(fast.sde_window_size, 2);
  EXPECT_EQ(fast.sde_window_range, (std::vector<int64_t>{0, 4}));
  DRAY_ASSERT_OK_AND_ASSIGN(fast, TrainConfig::Load("", {"algorithm.name=flow_grpo_fast",
                                                         "algorithm.sde_window_size=1"}));
  EXPECT_EQ(fast.sde_window_size, 1);
  EXPECT_THAT(
      TrainConfig::Load("", {"algorithm.name=flow_grpo_fast", "algorithm.sde_window_size=0"}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("algorithm.sde_window_size")));
}

std::string Scratch(const std::string& name) {
  const fs::path dir = fs::path(std::getenv("TEST_TMPDIR")) / name;
  fs::create_directories(dir);
  return dir.string();
}

TEST(TrainDataTest, TheEmbeddedTaskReadsBack) {
  DRAY_ASSERT_OK_AND_ASSIGN(std::string jsonl, WriteEmbeddedTask(Scratch("task")));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<TrainPrompt> prompts, ReadTrainPrompts(jsonl));
  ASSERT_EQ(prompts.size(), 4u);
  EXPECT_EQ(prompts[0].instruction, "make it yellow");
  EXPECT_EQ(prompts[0].pixels.sizes(), (std::vector<int64_t>{64, 64, 3}));
  // Each row's target is the exact edit of its own scene.
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor exact, ApplyEdit(prompts[0].pixels, "make it yellow"));
  EXPECT_TRUE(prompts[0].target_pixels.equal(exact));
  EXPECT_FALSE(prompts[1].target_pixels.equal(exact));
}

TEST(TrainDataTest, PreferenceRowsNameAChosenAndARejectedEdit) {
  DRAY_ASSERT_OK_AND_ASSIGN(std::string jsonl, WriteEmbeddedPreferences(Scratch("preferences")));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<TrainPrompt> prompts,
                            ReadTrainPrompts(jsonl, RowKind::kPreference));
  ASSERT_EQ(prompts.size(), 4u);
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor chosen, ApplyEdit(prompts[0].pixels, "make it yellow"));
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor rejected, ApplyEdit(prompts[0].pixels, "make it blue"));
  EXPECT_TRUE(prompts[0].target_pixels.equal(chosen));
  EXPECT_TRUE(prompts[0].rejected_pixels.equal(rejected));
  const std::string dir = Scratch("preference_rows");
  ASSERT_TRUE(WritePngFile(dir + "/a.png", at::zeros({8, 8, 3}, at::kByte)).ok());
  ASSERT_TRUE(WriteFile(dir + "/train.jsonl",
                        R"({"image": "a.png", "instruction": "x", "chosen": "a.png"})")
                  .ok());
  EXPECT_THAT(ReadTrainPrompts(dir + "/train.jsonl", RowKind::kPreference),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.jsonl:1: the row has no \"rejected\"")));
}

TEST(TrainDataTest, BadRowsNameTheFileAndLine) {
  const std::string dir = Scratch("bad");
  ASSERT_TRUE(WritePngFile(dir + "/a.png", at::zeros({8, 8, 3}, at::kByte)).ok());
  ASSERT_TRUE(WritePngFile(dir + "/b.png", at::zeros({8, 9, 3}, at::kByte)).ok());
  auto data = [&](const std::string& text) {
    EXPECT_TRUE(WriteFile(dir + "/train.jsonl", text).ok());
    return ReadTrainPrompts(dir + "/train.jsonl");
  };
  const std::string good = R"({"image": "a.png", "instruction": "make it red"})";
  EXPECT_THAT(data(good + "\n" + R"({"image": "missing.png", "instruction": "x"})"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("train.jsonl:2: cannot read image")));
  EXPECT_THAT(data(good + "\n" + R"({"image": "a.png"})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.jsonl:2: the row has no \"instruction\"")));
  EXPECT_THAT(data("[1, 2]"), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("train.jsonl:1: not a JSON object")));
  // Images of other sizes are read (a step's rows are then of one size: sft_test).
  DRAY_EXPECT_OK(data(good + "\n" + R"({"image": "b.png", "instruction": "x"})").status());
  EXPECT_THAT(ReadTrainPrompts(dir + "/nothing.jsonl"), StatusIs(absl::StatusCode::kNotFound));
}

double Score(const std::string& name, const RewardInput& input) {
  absl::StatusOr<RewardFunction> reward = FindRewardFunction(name);
  EXPECT_TRUE(reward.ok()) << reward.status();
  absl::StatusOr<double> value = (*reward)(input);
  EXPECT_TRUE(value.ok()) << value.status();
  return value.value_or(NAN);
}

TEST(RewardsTest, ScoreWhatTheySay) {
  const at::Tensor red = at::zeros({16, 16, 3}, at::kByte);
  red.select(2, 0).fill_(255);
  const at::Tensor noise = at::randint(0, 256, {16, 16, 3}, at::kLong).to(at::kByte);
  EXPECT_DOUBLE_EQ(Score("color", {red, red, "make it red", nlohmann::json::object()}), 1.0);
  EXPECT_LT(Score("color", {red, red, "make it cyan", nlohmann::json::object()}), 0.2);
  EXPECT_DOUBLE_EQ(Score("color", {red, red, "anything", {{"target_color", {255, 0, 0}}}}), 1.0);
  EXPECT_GT(Score("jpeg_compressibility", {red, red, "", {}}),
            Score("jpeg_compressibility", {noise, red, "", {}}));
  EXPECT_GT(Score("jpeg_incompressibility", {noise, red, "", {}}),
            Score("jpeg_incompressibility", {red, red, "", {}}));
  EXPECT_GT(Score("consistency", {red, red, "", {}}), Score("consistency", {noise, red, "", {}}));
  // structure is blind to colour: the scene recoloured keeps it, a flat image has none.
  const at::Tensor scene = SyntheticScene(3, 32, 32);
  const at::Tensor tinted =
      (scene.to(at::kInt) / 2 + at::tensor({120, 120, 0}, at::kInt)).to(at::kByte);
  EXPECT_GT(Score("structure", {tinted, scene, "", {}}), 0.99);
  EXPECT_EQ(Score("structure", {red, scene, "", {}}), 0.0);
  EXPECT_LT(Score("structure", {noise, scene, "", {}}), 0.5);
  // target_psnr: PSNR against the row's target (at the output's size), / 50.
  const at::Tensor big_red = at::zeros({32, 32, 3}, at::kByte);
  big_red.select(2, 0).fill_(255);
  EXPECT_DOUBLE_EQ(Score("target_psnr", {red, noise, "", {}, big_red}), 2.0);
  const at::Tensor off = red.clone();
  off.select(2, 1).fill_(25);  // MSE 25^2 / 3
  EXPECT_NEAR(Score("target_psnr", {off, noise, "", {}, red}),
              10 * std::log10(255.0 * 255.0 * 3 / (25.0 * 25.0)) / 50, 1e-12);
  EXPECT_THAT(FindRewardFunction("target_psnr").value()({red, red, "", {}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no \"target\" image")));
  EXPECT_THAT(FindRewardFunction("color").value()({red, red, "make it nice", {}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("names no colour")));
  EXPECT_THAT(FindRewardFunction("aesthetic").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("registered: color, consistency")));
}

}  // namespace
}  // namespace dray
