// Parity of the scheduler and pipeline helpers with diffusers, on every case in
// reference/qwen_image/{scheduler,helpers}. Sigmas, timesteps, packing and
// sizes match exactly; Euler steps within the README's 1e-6.
#include <regex>
#include <string>

#include "dispatch/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "runtime/safetensors.h"
#include "tests/models/reference.h"
#include <ATen/ops/zeros.h>
#include "gmock/gmock.h"
#include "workers/models/qwen_image/pipeline_helpers.h"
#include "workers/models/qwen_image/scheduler.h"

namespace dray::qwen_image {
namespace {

using ::dray::testing::StatusIs;

FlowMatchEulerConfig ReferenceConfig() {
  return FlowMatchEulerConfig::FromFile(ReferencePath("scheduler/scheduler_config.json")).value();
}

TEST(SchedulerParityTest, ConfigReadsDiffusersKeys) {
  const FlowMatchEulerConfig config = ReferenceConfig();
  EXPECT_TRUE(config.use_dynamic_shifting);
  EXPECT_EQ(config.max_image_seq_len, 8192);
  EXPECT_EQ(config.shift_terminal.value(), 0.02);
  auto from_text = [](const char* text) {
    return FlowMatchEulerConfig::FromJson(JsonConfig::Parse(text, "test.json").value());
  };
  EXPECT_THAT(from_text(R"({"shift": 1.0, "sheep": 3})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("test.json: unknown key sheep; known keys: base_image_seq_len")));
  EXPECT_THAT(from_text(R"({"shift": "big"})"),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("'shift' must be a number")));
  EXPECT_THAT(from_text(R"({"use_karras_sigmas": true})"), StatusIs(absl::StatusCode::kUnimplemented));
}

TEST(SchedulerParityTest, SchedulesMatchExactly) {
  const nlohmann::json cases = ReadReferenceJson("scheduler/cases.json");
  for (const auto& schedule : cases["schedules"]) {
    const int steps = schedule["num_inference_steps"];
    const auto args = schedule["calculate_shift_args"].get<std::vector<double>>();
    const double mu = CalculateShift(static_cast<int64_t>(args[0]), static_cast<int64_t>(args[1]),
                                     static_cast<int64_t>(args[2]), args[3], args[4]);
    EXPECT_EQ(mu, schedule["mu"].get<double>());
    SCOPED_TRACE(absl::StrCat(steps, " steps, mu ", mu));

    const nlohmann::json& pipeline = schedule["pipeline"];
    EXPECT_EQ(Linspace(1.0, 1.0 / steps, steps), pipeline["sigmas_in_float64"].get<std::vector<double>>());
    FlowMatchEulerScheduler scheduler(ReferenceConfig());
    DRAY_ASSERT_OK(scheduler.SetSigmas(Linspace(1.0, 1.0 / steps, steps), mu));
    EXPECT_EQ(MaxAbsDiff(scheduler.sigmas(), JsonTensor(pipeline["sigmas"])), 0);
    EXPECT_EQ(MaxAbsDiff(scheduler.timesteps(), JsonTensor(pipeline["timesteps"])), 0);
    EXPECT_EQ(MaxAbsDiff(scheduler.timesteps() / 1000, JsonTensor(pipeline["transformer_timestep_input"])), 0);

    DRAY_ASSERT_OK(scheduler.SetTimesteps(steps, mu));
    EXPECT_EQ(MaxAbsDiff(scheduler.sigmas(), JsonTensor(schedule["set_timesteps_default"]["sigmas"])), 0);
    EXPECT_EQ(MaxAbsDiff(scheduler.timesteps(), JsonTensor(schedule["set_timesteps_default"]["timesteps"])), 0);
  }
}

TEST(SchedulerParityTest, EulerStepsMatch) {
  const nlohmann::json cases = ReadReferenceJson("scheduler/cases.json");
  const nlohmann::json& first = cases["step_cases"][0];
  const int steps = first["num_inference_steps"];
  FlowMatchEulerScheduler scheduler(ReferenceConfig());
  DRAY_ASSERT_OK(scheduler.SetSigmas(Linspace(1.0, 1.0 / steps, steps), first["mu"].get<double>()));
  for (const auto& step : cases["step_cases"]) {
    EXPECT_EQ(scheduler.timesteps()[step["i"].get<int>()].item<float>(), step["timestep"].get<float>());
    DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor previous,
                              scheduler.Step(JsonTensor(step["model_output"]), JsonTensor(step["sample"])));
    EXPECT_LE(MaxAbsDiff(previous, JsonTensor(step["prev_sample"])), 1e-6) << "step " << step["i"];
    EXPECT_EQ(scheduler.step_index(), step["step_index_after"].get<int>());
  }
  EXPECT_THAT(scheduler.Step(JsonTensor(first["model_output"]), JsonTensor(first["sample"])),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(HelpersParityTest, DimensionsAndShiftsMatchExactly) {
  const nlohmann::json cases = ReadReferenceJson("helpers/cases.json");
  for (const auto& c : cases["calculate_dimensions"]) {
    const auto [width, height] = CalculateDimensions(c["target_area"].get<double>(), c["ratio"].get<double>());
    EXPECT_EQ(width, c["width"].get<int64_t>()) << c;
    EXPECT_EQ(height, c["height"].get<int64_t>()) << c;
  }
  for (const auto& c : cases["calculate_shift"]) {
    std::vector<double> args = c["args"].get<std::vector<double>>();
    if (c.contains("defaults")) {
      for (double d : c["defaults"].get<std::vector<double>>()) args.push_back(d);
    }
    EXPECT_EQ(CalculateShift(static_cast<int64_t>(args[0]), static_cast<int64_t>(args[1]),
                             static_cast<int64_t>(args[2]), args[3], args[4]),
              c["mu"].get<double>()) << c;
  }
}

TEST(HelpersParityTest, PackAndUnpackMatchExactly) {
  const nlohmann::json cases = ReadReferenceJson("helpers/cases.json");
  DRAY_ASSERT_OK_AND_ASSIGN(auto file, SafetensorsFile::Open(ReferencePath("helpers/pack_unpack.safetensors")));
  const std::regex unpack_args(R"(height=(\d+), width=(\d+), vae_scale_factor=(\d+))");
  for (const auto& [name, c] : cases["pack_unpack"].items()) {
    const at::Tensor input = file->Get(name + ".input").value();
    const at::Tensor expected = file->Get(name + ".output").value();
    absl::StatusOr<at::Tensor> output;
    std::smatch match;
    const std::string call = c["call"];
    if (name.rfind("pack", 0) == 0) {
      output = PackLatents(input);
    } else {
      ASSERT_TRUE(std::regex_search(call, match, unpack_args)) << call;
      output = UnpackLatents(input, std::stoll(match[1]), std::stoll(match[2]), std::stoll(match[3]));
    }
    DRAY_ASSERT_OK(output.status());
    EXPECT_EQ(MaxAbsDiff(*output, expected), 0) << name;
  }
  EXPECT_THAT(PackLatents(at::zeros({1, 4, 1, 3, 8})), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(UnpackLatents(at::zeros({1, 5, 16}), 48, 32, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("expected 24 tokens")));
}

}  // namespace
}  // namespace dray::qwen_image
