// Unit tests of the scheduler and pipeline helpers beyond parity (which
// parity_test covers): configuration errors and misuse.
#include <string>

#include <ATen/ATen.h>
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/models/reference.h"
#include "workers/models/qwen_image/pipeline_helpers.h"
#include "workers/models/qwen_image/scheduler.h"

namespace dray::qwen_image {
namespace {

using ::dray::testing::StatusIs;

FlowMatchEulerConfig ReferenceConfig() {
  return FlowMatchEulerConfig::FromFile(ReferencePath("scheduler/scheduler_config.json")).value();
}

TEST(SchedulerTest, ConfigReadsDiffusersKeys) {
  const FlowMatchEulerConfig config = ReferenceConfig();
  EXPECT_TRUE(config.use_dynamic_shifting);
  EXPECT_EQ(config.max_image_seq_len, 8192);
  EXPECT_EQ(config.shift_terminal.value(), 0.02);
  auto from_text = [](const char* text) {
    return FlowMatchEulerConfig::FromJson(JsonConfig::Parse(text, "test.json").value());
  };
  EXPECT_THAT(from_text(R"({"shift": 1.0, "sheep": 3})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr(
                           "test.json: unknown key sheep; known keys: base_image_seq_len")));
  EXPECT_THAT(from_text(R"({"shift": "big"})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("'shift' must be a number")));
  EXPECT_THAT(from_text(R"({"use_karras_sigmas": true})"),
              StatusIs(absl::StatusCode::kUnimplemented));
}

TEST(SchedulerTest, OneStepFromPureNoiseIsNotStretchedToNaN) {
  // diffusers stretches [1] by (1 - 1) / (1 - 1) = NaN: dray keeps [1, 0].
  FlowMatchEulerScheduler scheduler(FlowMatchEulerConfig::QwenImage());
  DRAY_ASSERT_OK(scheduler.SetSigmas(Linspace(1.0, 1.0, 1), 0.5));
  EXPECT_TRUE(at::equal(scheduler.sigmas(), at::tensor({1.0f, 0.0f})));
  EXPECT_FLOAT_EQ(scheduler.timesteps()[0].item<float>(), 1000);
}

TEST(SchedulerTest, StepChecksItsState) {
  FlowMatchEulerScheduler scheduler(FlowMatchEulerConfig::QwenImage());
  EXPECT_THAT(scheduler.Step(at::zeros({2}), at::zeros({2})),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(scheduler.SetSigmas(Linspace(1.0, 0.5, 2), std::nullopt),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("needs mu")));
  DRAY_ASSERT_OK(scheduler.SetSigmas(Linspace(1.0, 0.5, 2), 0.5));
  EXPECT_THAT(scheduler.Step(at::zeros({2}), at::zeros({3})),
              StatusIs(absl::StatusCode::kInvalidArgument));
  DRAY_ASSERT_OK(scheduler.Step(at::zeros({2}), at::zeros({2})).status());
  DRAY_ASSERT_OK(scheduler.Step(at::zeros({2}), at::zeros({2})).status());
  EXPECT_THAT(scheduler.Step(at::zeros({2}), at::zeros({2})),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::HasSubstr("all 2 steps")));
}

TEST(HelpersTest, EditOutputSizeFollowsThePipeline) {
  // 640x480 (4:3) at about one megapixel: 1184 x 896, already multiples of 16.
  EXPECT_EQ(EditOutputSize(640, 480, std::nullopt, std::nullopt, 8),
            std::make_pair(int64_t{1184}, int64_t{896}));
  // A requested size is floored to multiples of 2 x vae_scale_factor.
  EXPECT_EQ(EditOutputSize(640, 480, 1000, 777, 8), std::make_pair(int64_t{992}, int64_t{768}));
  EXPECT_EQ(EditOutputSize(100, 300, 50, std::nullopt, 4),
            std::make_pair(int64_t{48}, int64_t{1760}));
}

TEST(HelpersTest, PackingRejectsShapesItCannotTile) {
  EXPECT_THAT(PackLatents(at::zeros({1, 4, 1, 3, 8})),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(
      UnpackLatents(at::zeros({1, 5, 16}), 48, 32, 4),
      StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("expected 24 tokens")));
  // Pack and unpack are inverse permutations.
  const at::Tensor latents = at::randn({2, 4, 1, 6, 10});
  EXPECT_TRUE(at::equal(UnpackLatents(PackLatents(latents).value(), 24, 40, 4).value(), latents));
}

}  // namespace
}  // namespace dray::qwen_image
