#include "workers/train/prompt_sampler.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "workers/image/image_codec.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/train/training_protocol.h"

namespace dray {
namespace {

// Prompts: `count` prompts named "p0", "p1", ..., the first `small` of them
// 8x8 images and the rest 16x8, each with a target.
std::vector<TrainPrompt> Prompts(int count, int small = 0) {
  std::vector<TrainPrompt> prompts;
  for (int i = 0; i < count; ++i) {
    TrainPrompt prompt;
    prompt.pixels = at::full({i < small ? 8 : 16, 8, 3}, i, at::kByte);
    prompt.image = EncodePng(prompt.pixels).value();
    prompt.target = prompt.image;
    prompt.instruction = "p" + std::to_string(i);
    prompt.image_path = prompt.instruction + ".png";
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

TrainConfig Config(int64_t prompts_per_step, int64_t group_size = 2, uint64_t seed = 7) {
  TrainConfig config;
  config.prompts_per_step = prompts_per_step;
  config.group_size = group_size;
  config.seed = seed;
  return config;
}

std::vector<std::string> InstructionsOf(const PromptSampler& sampler, int64_t step) {
  std::vector<std::string> names;
  for (const TrainPrompt* prompt : sampler.PromptsOf(step)) names.push_back(prompt->instruction);
  return names;
}

TEST(StreamSeedTest, KeepsEveryRunsDrawsAsTheyWere) {
  // splitmix64 of (seed, stream, index): pinned, since every run's results
  // follow from these numbers.
  EXPECT_EQ(StreamSeed(42, SeedStream::kPromptOrder, 3), 0x47c89d334f282abeULL);
  EXPECT_EQ(StreamSeed(42, SeedStream::kSampleSeed, 1000003), 0xd4e074f27094cc2ULL);
}

TEST(PromptSamplerTest, EachPassOverTheDataDrawsEveryPromptOnce) {
  const PromptSampler sampler(Config(/*prompts_per_step=*/2), Prompts(5));
  std::vector<std::string> drawn;
  for (int64_t step = 0; step < 5; ++step) {
    for (const std::string& name : InstructionsOf(sampler, step)) drawn.push_back(name);
  }
  for (int pass = 0; pass < 2; ++pass) {
    const std::set<std::string> seen(drawn.begin() + pass * 5, drawn.begin() + pass * 5 + 5);
    EXPECT_EQ(seen.size(), 5u) << "pass " << pass;
  }
  EXPECT_NE(std::vector<std::string>(drawn.begin(), drawn.begin() + 5),
            std::vector<std::string>(drawn.begin() + 5, drawn.end()))
      << "each pass has an order of its own";
}

TEST(PromptSamplerTest, DrawsFollowTheSeedAndTheStepAlone) {
  const PromptSampler one(Config(3), Prompts(6)), again(Config(3), Prompts(6));
  const PromptSampler other(Config(3, 2, /*seed=*/8), Prompts(6));
  bool differs = false;
  for (int64_t step : {0, 1, 5, 4}) {
    EXPECT_EQ(InstructionsOf(one, step), InstructionsOf(again, step));
    EXPECT_EQ(one.TrainedSteps(step, 9), again.TrainedSteps(step, 9));
    differs |= InstructionsOf(one, step) != InstructionsOf(other, step);
  }
  EXPECT_TRUE(differs);
}

TEST(PromptSamplerTest, AStepsPromptsShareTheFirstOnesImageSize) {
  const PromptSampler sampler(Config(4), Prompts(6, /*small=*/3));
  for (int64_t step = 0; step < 8; ++step) {
    const std::vector<const TrainPrompt*> prompts = sampler.PromptsOf(step);
    ASSERT_EQ(prompts.size(), 4u);
    for (const TrainPrompt* prompt : prompts)
      EXPECT_EQ(prompt->pixels.sizes(), prompts.front()->pixels.sizes()) << "step " << step;
  }
}

TEST(PromptSamplerTest, RolloutRowsRepeatEachPromptWithSeedsOfTheirOwn) {
  TrainConfig config = Config(/*prompts_per_step=*/2, /*group_size=*/3);
  config.num_inference_steps = 10;
  config.sde_window_size = 2;
  config.sde_window_range = {0, 5};
  const PromptSampler sampler(config, Prompts(4));
  for (int64_t step = 0; step < 6; ++step) {
    DRAY_ASSERT_OK_AND_ASSIGN(DataProto rows, sampler.RolloutRows(step));
    ASSERT_EQ(rows.size(), 6);
    DRAY_ASSERT_OK_AND_ASSIGN(const std::vector<std::string>* instructions,
                              rows.GetRows<std::string>(kInstructionsColumn));
    const std::vector<std::string> prompts = InstructionsOf(sampler, step);
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ((*instructions)[i], prompts[i / 3]);
    DRAY_ASSERT_OK_AND_ASSIGN(const std::vector<int64_t>* seeds,
                              rows.GetRows<int64_t>(kSeedsColumn));
    EXPECT_EQ(std::set<int64_t>(seeds->begin(), seeds->end()).size(), 6u) << "a seed per row";
    const int64_t begin = rows.GetMeta<int64_t>(kSdeWindowBeginKey).value();
    EXPECT_EQ(rows.GetMeta<int64_t>(kSdeWindowEndKey).value(), begin + 2);
    EXPECT_GE(begin, 0);
    EXPECT_LE(begin + 2, 5);
  }
}

TEST(PromptSamplerTest, MixGrpoSlidesItsWindowOrDrawsItWithinTheTrainableSteps) {
  TrainConfig config = Config(2);
  config.name = "mix_grpo";
  config.num_inference_steps = 8;  // trainable: steps 0..5
  config.sde_window_size = 4;
  config.mix_window.iters_per_group = 2;
  const PromptSampler sliding(config, Prompts(2));
  const std::vector<std::pair<int64_t, int64_t>> expected = {
      {0, 4}, {0, 4}, {1, 5}, {1, 5}, {2, 6}, {2, 6}, {3, 6}, {3, 6},
      {4, 6}, {4, 6}, {5, 6}, {5, 6}, {6, 6}, {6, 6}, {0, 4}};  // empty at the end, then back
  for (size_t step = 0; step < expected.size(); ++step)
    EXPECT_EQ(sliding.SdeWindowOf(step), expected[step]) << "step " << step;
  EXPECT_TRUE(sliding.TrainedSteps(12, 0).empty());
  config.mix_window.strategy = "random";
  const PromptSampler random(config, Prompts(2));
  std::set<int64_t> begins;
  for (int64_t step = 0; step < 40; ++step) {
    const auto [begin, end] = random.SdeWindowOf(step);
    EXPECT_EQ(end - begin, 4);
    EXPECT_LE(end, 6);
    begins.insert(begin);
  }
  EXPECT_EQ(begins, (std::set<int64_t>{0, 1, 2}));
}

TEST(PromptSamplerTest, DanceGrpoGroupsShareTheirInitialNoiseAndTrainAllButTheLastStep) {
  TrainConfig config = Config(/*prompts_per_step=*/2, /*group_size=*/3);
  config.name = "dance_grpo";
  config.num_inference_steps = 20;
  config.timestep_fraction = 0.6;
  const PromptSampler sampler(config, Prompts(4));
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto rows, sampler.RolloutRows(0));
  DRAY_ASSERT_OK_AND_ASSIGN(const std::vector<int64_t>* seeds, rows.GetRows<int64_t>(kSeedsColumn));
  DRAY_ASSERT_OK_AND_ASSIGN(const std::vector<int64_t>* own,
                            rows.GetRows<int64_t>(kSdeSeedsColumn));
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ((*seeds)[i], (*own)[i - i % 3]) << "row " << i;
  EXPECT_EQ(std::set<int64_t>(own->begin(), own->end()).size(), 6u) << "SDE noise of its own";
  EXPECT_EQ(sampler.SdeWindowOf(0), std::make_pair(int64_t{0}, int64_t{20}));
  const std::vector<int64_t> trained = sampler.TrainedSteps(0, 20);
  EXPECT_EQ(trained.size(), 11u);  // int(19 x 0.6), as DanceGRPO
  EXPECT_LT(trained.back(), 19) << "the last step is never trained";
  // Each sample trains a subset of its own, DanceGRPO's perms[i][:11].
  const at::Tensor subsets = sampler.RowTrainedSteps(0, 6, 20);
  EXPECT_EQ(subsets.sizes(), (std::vector<int64_t>{6, 11}));
  EXPECT_TRUE((subsets >= 0).all().item<bool>() && (subsets < 19).all().item<bool>());
  for (int64_t r = 0; r < 6; ++r)
    EXPECT_EQ(std::get<0>(at::_unique(subsets[r])).numel(), 11) << "row " << r << " repeats a step";
  EXPECT_FALSE(subsets[0].equal(subsets[1])) << "the same subset for two samples";
  EXPECT_TRUE(subsets.equal(sampler.RowTrainedSteps(0, 6, 20))) << "seeded";
  config.name = "mix_grpo";  // MixGRPO's scripts share it too
  DRAY_ASSERT_OK_AND_ASSIGN(rows, PromptSampler(config, Prompts(4)).RolloutRows(0));
  EXPECT_TRUE(rows.HasColumn(kSdeSeedsColumn));
  config.init_same_noise = false;
  DRAY_ASSERT_OK_AND_ASSIGN(rows, PromptSampler(config, Prompts(4)).RolloutRows(0));
  EXPECT_FALSE(rows.HasColumn(kSdeSeedsColumn));
}

TEST(PromptSamplerTest, DiffusionNftRollsOutWithoutAWindowAndShufflesEachRowsTimesteps) {
  TrainConfig config = Config(/*prompts_per_step=*/2, /*group_size=*/3);
  config.name = "diffusion_nft";
  config.num_inference_steps = 10;
  config.timestep_fraction = 0.99;
  const PromptSampler sampler(config, Prompts(4));
  EXPECT_EQ(sampler.SdeWindowOf(0), std::make_pair(int64_t{0}, int64_t{0}));
  // Each row's own permutation of the 10 timesteps, its first int(10 x 0.99).
  const at::Tensor first = sampler.RowTrainedSteps(0, 6, 10, /*epoch=*/0);
  EXPECT_EQ(first.sizes(), (std::vector<int64_t>{6, 9}));
  for (int64_t r = 0; r < 6; ++r)
    EXPECT_EQ(std::get<0>(at::_unique(first[r])).numel(), 9) << "row " << r << " repeats a step";
  EXPECT_FALSE(first[0].equal(first[1]));
  EXPECT_FALSE(first.equal(sampler.RowTrainedSteps(0, 6, 10, /*epoch=*/1))) << "drawn afresh";
}

TEST(PromptSamplerTest, PairedRowsCarryTargetsAndSigmaDraws) {
  const PromptSampler sampler(Config(3), Prompts(3));
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto rows, sampler.PairedRows(0));
  ASSERT_EQ(rows.size(), 3);
  DRAY_ASSERT_OK_AND_ASSIGN(const std::vector<Image>* targets, rows.GetRows<Image>(kTargetsColumn));
  EXPECT_EQ(targets->size(), 3u);
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor draws, rows.GetTensor(kSigmaDrawsColumn));
  EXPECT_TRUE((draws >= 0).all().item<bool>() && (draws < 1).all().item<bool>());
}

TEST(PromptSamplerTest, DpoRowsCarryTheRejectedEditAndLogitNormalDraws) {
  TrainConfig config = Config(3);
  config.name = "dpo";
  config.num_inference_steps = 10;
  config.timestep_fraction = 0.5;
  std::vector<TrainPrompt> prompts = Prompts(3);
  for (TrainPrompt& prompt : prompts) prompt.rejected = prompt.image;
  const PromptSampler sampler(config, std::move(prompts));
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto rows, sampler.PairedRows(0));
  DRAY_ASSERT_OK_AND_ASSIGN(const std::vector<Image>* rejected,
                            rows.GetRows<Image>(kRejectedColumn));
  EXPECT_EQ(rejected->size(), 3u);
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor draws, rows.GetTensor(kSigmaDrawsColumn));
  EXPECT_EQ(draws.sizes(), (std::vector<int64_t>{3, 5}));  // int(10 x 0.5) draws per pair
  EXPECT_TRUE((draws > 0).all().item<bool>() && (draws < 1).all().item<bool>());
}

TEST(PromptSamplerTest, TrainedStepsAreASortedShareOfTheWindow) {
  TrainConfig config = Config(2);
  config.timestep_fraction = 0.5;
  const PromptSampler sampler(config, Prompts(2));
  const std::vector<int64_t> steps = sampler.TrainedSteps(3, 9);
  EXPECT_EQ(steps.size(), 5u);  // round(4.5)
  EXPECT_TRUE(std::is_sorted(steps.begin(), steps.end()));
  EXPECT_EQ(std::set<int64_t>(steps.begin(), steps.end()).size(), steps.size());
  config.timestep_fraction = 0.01;
  EXPECT_EQ(PromptSampler(config, Prompts(2)).TrainedSteps(3, 9).size(), 1u) << "at least one";
}

TEST(PromptSamplerTest, UpdateOrderShufflesWithinEachRanksShare) {
  const PromptSampler sampler(Config(4), Prompts(4));
  const std::vector<int64_t> order = sampler.UpdateOrder(2, 1, /*rows=*/12, /*ranks=*/3);
  ASSERT_EQ(order.size(), 12u);
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(order[i] / 4, i / 4) << "row " << i;
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(sorted[i], i);
  EXPECT_NE(order, sampler.UpdateOrder(2, 2, 12, 3)) << "each inner epoch its own order";
  std::vector<int64_t> rollout_order(12);
  std::iota(rollout_order.begin(), rollout_order.end(), 0);
  EXPECT_EQ(sampler.UpdateOrder(2, 0, 12, 3), rollout_order) << "the first epoch: the rollout's";
}

}  // namespace
}  // namespace dray
