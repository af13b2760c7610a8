// Training FLUX.1 Kontext through the same trainer, workers, sharding and
// checkpoints as Qwen-Image-Edit, on a random flux-tiny model directory:
// flow_grpo's Kontext choices as defaults, every algorithm Kontext runs
// training, two sharded ranks agreeing with one, a resumed run equal to an
// uninterrupted one, gradient checkpointing (either family) changing no
// weight, and the jobs it cannot run refused by name.
#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/train/train_test_util.h"
#include "workers/models/flux/model.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::Contains;
using ::testing::HasSubstr;

// KontextModel: a random flux-tiny directory, written once per process.
const std::string& KontextModel() {
  static const std::string dir = [] {
    const std::string path = SaveDir("flux_tiny");
    EXPECT_TRUE(
        flux::WriteRandomFluxKontextModel(path, flux::FluxPresetNamed("flux-tiny").value(), 0)
            .ok());
    return path;
  }();
  return dir;
}

// KontextOverrides: SmallJob's sizes on the Kontext model, then `more`.
std::vector<std::string> KontextOverrides(std::vector<std::string> more = {}) {
  std::vector<std::string> all = {"worker.image_edit.model_path=" + KontextModel(),
                                  "worker.rollout.resolution=64"};
  all.insert(all.end(), more.begin(), more.end());
  return all;
}

absl::Status Train(const TrainConfig& config, int workers = 1) {
  DRAY_ASSIGN_OR_RETURN(auto trainer, StartTrainer(config, workers));
  return trainer->Run();
}

// ExpectSameWeights: two runs' final adapters agree to `tolerance`.
void ExpectSameWeights(const std::string& dir, const std::string& other, double tolerance) {
  const auto expected = LoraWeights(other), actual = LoraWeights(dir);
  ASSERT_FALSE(expected.empty());
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, tensor] : expected)
    EXPECT_LE((actual.at(name) - tensor).abs().max().item<double>(), tolerance) << name;
}

TEST(KontextTrainingTest, DefaultsAreFlowGrpoKontextChoices) {
  DRAY_ASSERT_OK_AND_ASSIGN(TrainConfig config, TrainConfig::Load("", KontextOverrides()));
  EXPECT_EQ(config.lora_rank, 64);
  EXPECT_EQ(config.lora_alpha, 128);
  EXPECT_THAT(config.lora_target_modules, Contains("proj_mlp"));
  EXPECT_THAT(config.lora_target_modules, Contains("ff_context.net.2"));
  EXPECT_EQ(config.model.guidance_scale, 2.5);
  EXPECT_EQ(config.model.max_prompt_tokens, 128);
  EXPECT_EQ(config.model.negative_prompt, "");  // no true CFG
  // What the user sets wins.
  DRAY_ASSERT_OK_AND_ASSIGN(
      config, TrainConfig::Load("", KontextOverrides({"worker.image_edit.guidance_scale=3.5",
                                                      "worker.actor.lora_rank=8"})));
  EXPECT_EQ(config.model.guidance_scale, 3.5);
  EXPECT_EQ(config.lora_rank, 8);
}

TEST(KontextTrainingTest, EveryAlgorithmKontextRunsTrains) {
  for (const std::string algorithm : {"sft", "grpo", "flow_grpo_fast", "grpo_guard", "mix_grpo",
                                      "dance_grpo", "diffusion_nft", "dpo"}) {
    SCOPED_TRACE(algorithm);
    const std::string dir = SaveDir("kontext_" + algorithm);
    std::vector<std::string> overrides = {"algorithm.name=" + algorithm};
    if (algorithm == "mix_grpo")  // room for its window of 4 in steps 0 .. steps - 3
      overrides.push_back("worker.rollout.num_inference_steps=6");
    DRAY_ASSERT_OK(Train(SmallJob(dir, KontextOverrides(overrides))));
    const std::vector<nlohmann::json> steps = StepMetrics(dir);
    ASSERT_EQ(steps.size(), 2u);
    for (const nlohmann::json& step : steps) {
      EXPECT_TRUE(std::isfinite(step.at("loss").get<double>())) << step.dump();
      EXPECT_GT(step.at("grad_norm").get<double>(), 0) << step.dump();
    }
    EXPECT_FALSE(LoraWeights(dir).empty());
  }
}

// T5 and the transformer sharded over two ranks (FULL_SHARD) train what
// one rank does, up to the order of float64 sums.
TEST(KontextTrainingTest, TwoShardedRanksTrainAsOne) {
  const std::vector<std::string> job = KontextOverrides({kFloat64});
  const std::string one = SaveDir("kontext_one_rank"), two = SaveDir("kontext_two_ranks");
  DRAY_ASSERT_OK(Train(SmallJob(one, job), 1));
  DRAY_ASSERT_OK(Train(SmallJob(two, job), 2));
  ExpectSameWeights(two, one, kFloat64OrderBound);
  const auto one_steps = StepMetrics(one), two_steps = StepMetrics(two);
  ASSERT_EQ(two_steps.size(), one_steps.size());
  for (size_t i = 0; i < one_steps.size(); ++i) {
    EXPECT_NEAR(two_steps[i]["reward_mean"].get<double>(),
                one_steps[i]["reward_mean"].get<double>(), kFloat64OrderBound);
  }
}

TEST(KontextTrainingTest, AResumedRunEqualsAnUninterruptedOne) {
  const std::string uninterrupted = SaveDir("kontext_uninterrupted"),
                    stopped = SaveDir("kontext_stopped");
  DRAY_ASSERT_OK(Train(SmallJob(uninterrupted, KontextOverrides())));
  DRAY_ASSERT_OK(Train(
      SmallJob(stopped, KontextOverrides({"trainer.total_steps=1", "trainer.save_every=1"}))));
  DRAY_ASSERT_OK(Train(SmallJob(stopped, KontextOverrides({"trainer.resume=auto"}))));
  ExpectSameWeights(stopped, uninterrupted, 0);
  EXPECT_EQ(StepMetrics(stopped).size(), 2u);
}

// worker.actor.gradient_checkpointing recomputes each block in backward,
// under FSDP over two ranks: the same weights, for either family (the
// random tiny Qwen-Image-Edit model too).
TEST(KontextTrainingTest, GradientCheckpointingTrainsTheSameWeights) {
  for (const bool kontext : {true, false}) {
    SCOPED_TRACE(kontext ? "FLUX.1 Kontext" : "Qwen-Image-Edit");
    const std::vector<std::string> sft = {kFloat64, "algorithm.name=sft"};
    std::vector<std::string> job = kontext ? KontextOverrides(sft) : sft;
    const std::string name = kontext ? "kontext" : "qwen";
    const std::string plain = SaveDir(name + "_plain"), recomputed = SaveDir(name + "_recomputed");
    DRAY_ASSERT_OK(Train(SmallJob(plain, job), 2));
    job.push_back("worker.actor.gradient_checkpointing=true");
    DRAY_ASSERT_OK(Train(SmallJob(recomputed, job), 2));
    ExpectSameWeights(recomputed, plain, kFloat64OrderBound);
  }
}

TEST(KontextTrainingTest, JobsKontextCannotRunAreRefusedByName) {
  for (const auto& [overrides, named] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"algorithm.name=vae"}, "algorithm.name vae"},
           {{"algorithm.name=dmd2"}, "algorithm.name dmd2"},
           {{"worker.actor.lora_rank=0", "algorithm.beta=0.01"}, "algorithm.beta > 0"},
           {{"algorithm.name=dpo", "worker.actor.lora_rank=0"}, "DPO without"}}) {
    SCOPED_TRACE(named);
    EXPECT_THAT(TrainConfig::Load("", KontextOverrides(overrides)),
                StatusIs(absl::StatusCode::kUnimplemented,
                         AllOf(HasSubstr("is FLUX.1 Kontext"), HasSubstr(named))));
  }
  EXPECT_THAT(TrainConfig::Load("", KontextOverrides({"worker.image_edit.max_prompt_tokens=600"})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hold at most 512 tokens")));
  // Its edits are worker.rollout.resolution^2 pixels whatever the algorithm.
  EXPECT_THAT(
      TrainConfig::Load("", KontextOverrides({"worker.image_edit.image_size=64"})),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("train's FLUX.1 Kontext runs")));
}

}  // namespace
}  // namespace dray
