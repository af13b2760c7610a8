// Runs `dray plan` as a user would: FLUX.1 Kontext [dev]'s real sizes on
// four 24 GiB cards, a train config's keys with flags over them, and a
// combination dray's FSDP refuses.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/runtime/test_util.h"

namespace dray {
namespace {

using ::testing::HasSubstr;

struct Ran {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

Ran RunPlan(const std::string& args) {
  FILE* plan = popen(absl::StrCat(RunfilePath("cli/dray"), " plan ", args, " 2>&1").c_str(), "r");
  EXPECT_NE(plan, nullptr);
  Ran ran;
  char buffer[4096];
  while (fgets(buffer, sizeof(buffer), plan) != nullptr) ran.output += buffer;
  const int status = pclose(plan);
  ran.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return ran;
}

TEST(PlanCliTest, KontextLoraFitsFour24GiBCardsWithCheckpointing) {
  const Ran ran = RunPlan(
      "--model flux-real --world-size 4 --lora-rank 32 --activation-checkpointing "
      "--text-encoders resident --device-memory 24GiB --json");
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  const nlohmann::json plan = nlohmann::json::parse(ran.output);
  EXPECT_EQ(plan["parameters"], 11991061568);  // 11.9B and the adapters
  EXPECT_EQ(plan["trainable"], 89653248);
  EXPECT_EQ(plan["image_tokens"], 8192);  // 4096 noisy + 4096 condition
  EXPECT_EQ(plan["text_tokens"], 512);
  EXPECT_EQ(plan["terms"].size(), 6u);
  EXPECT_TRUE(plan["fits"]) << plan["reason"];
  EXPECT_EQ(plan["dominant"], "buffers");  // T5-XXL resident
  EXPECT_LT(plan["total_bytes"].get<int64_t>(), int64_t{24} << 30);
}

TEST(PlanCliTest, FullFineTuningDoesNotFitAndSaysWhy) {
  const Ran ran = RunPlan(
      "--model flux-real --world-size 4 --lora-rank 0 --activation-checkpointing "
      "--text-encoders resident --device-memory 24GiB");
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_THAT(ran.output, HasSubstr("full fine-tuning"));
  EXPECT_THAT(ran.output, HasSubstr("does not fit"));
  EXPECT_THAT(ran.output, HasSubstr("the largest term is optimizer"));
}

TEST(PlanCliTest, ReadsATrainConfigAndFlagsWin) {
  const Ran ran = RunPlan(
      "--model flux-tiny worker.actor.lora_rank=0 worker.rollout.resolution=512 "
      "worker.image_edit.torch_dtype=bfloat16 worker.actor.micro_batch_size=2 --micro-batch 1 "
      "--json");
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  const nlohmann::json plan = nlohmann::json::parse(ran.output);
  EXPECT_EQ(plan["lora_rank"], 0);
  EXPECT_EQ(plan["image_tokens"], 2 * 32 * 32);
  EXPECT_EQ(plan["micro_batch"], 1);
}

// A Kontext directory with a train-config key plans what dray train runs
// on it (flow_grpo's LoRA, T5 padded to 128 tokens, T5 sharded), not the
// embedded task's defaults.
TEST(PlanCliTest, AKontextDirectoryTakesDrayTrainsDefaultsForIt) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/flux-tiny");
  ASSERT_EQ(std::system(absl::StrCat(RunfilePath("cli/dray"),
                                     " init-model --preset flux-tiny --out ", dir, " >/dev/null")
                            .c_str()),
            0);
  const Ran ran = RunPlan(absl::StrCat("--model ", dir, " trainer.seed=1 --json"));
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  const nlohmann::json plan = nlohmann::json::parse(ran.output);
  EXPECT_EQ(plan["lora_rank"], 64);
  EXPECT_EQ(plan["text_tokens"], 128);
}

TEST(PlanCliTest, RefusedCombinationsNameTheirFlags) {
  Ran ran = RunPlan("--model flux-tiny --strategy NO_SHARD");
  EXPECT_EQ(ran.exit_code, 1);
  EXPECT_THAT(ran.output, HasSubstr("--strategy NO_SHARD"));
  EXPECT_THAT(ran.output, HasSubstr("--dtype bfloat16"));
  ran = RunPlan("--model flux-tiny --resolution 1000");
  EXPECT_EQ(ran.exit_code, 1);
  EXPECT_THAT(ran.output, HasSubstr("--resolution"));
  ran = RunPlan("--model flux-tiny --device-memory lots");
  EXPECT_EQ(ran.exit_code, 1);
  EXPECT_THAT(ran.output, HasSubstr("--device-memory"));
  ran = RunPlan("--model no-such-model");
  EXPECT_EQ(ran.exit_code, 1);
  EXPECT_THAT(ran.output, HasSubstr("--model 'no-such-model'"));
}

}  // namespace
}  // namespace dray
