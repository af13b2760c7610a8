#include "dispatch/dispatch_mode.h"

#include <ATen/ops/arange.h>

#include <vector>

#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

DataProto Rows(int64_t begin, int64_t end) {
  return DataProto::Make({{"x", at::arange(begin, end, at::kLong)}}).value();
}

std::vector<int64_t> Values(const DataProto& data) {
  const at::Tensor x = data.GetTensor("x").value().contiguous();
  return std::vector<int64_t>(x.data_ptr<int64_t>(), x.data_ptr<int64_t>() + x.numel());
}

const DispatchMode& Mode(absl::string_view name) {
  return *DispatchRegistry::Global().Find(name).value();
}

// PlayMode plays a mode end to end with ranks that return their input unchanged.
absl::StatusOr<std::vector<DataProto>> PlayMode(absl::string_view name,
                                                std::vector<DataProto> inputs, int world_size,
                                                int* ranks_called = nullptr,
                                                bool rows_independent = false) {
  const DispatchMode& mode = Mode(name);
  absl::StatusOr<DispatchPlan> plan =
      mode.dispatch(std::move(inputs), {world_size, rows_independent});
  if (!plan.ok()) return plan.status();
  EXPECT_EQ(static_cast<int>(plan->per_rank.size()), world_size);
  std::vector<DataProto> outputs;
  for (const auto& input : plan->per_rank) {
    if (input != nullptr) outputs.push_back(*input);
  }
  if (ranks_called != nullptr) *ranks_called = static_cast<int>(outputs.size());
  return mode.collect(std::move(outputs), *plan);
}

TEST(DispatchModeTest, OneToAllSendsOneEncodingToEveryRank) {
  DRAY_ASSERT_OK_AND_ASSIGN(DispatchPlan plan, Mode(kOneToAll).dispatch({Rows(0, 3)}, {4}));
  for (const auto& input : plan.per_rank) EXPECT_EQ(input, plan.per_rank[0]);
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> out, PlayMode(kOneToAll, {Rows(0, 3)}, 4));
  ASSERT_EQ(out.size(), 4u);
  EXPECT_THAT(Values(out[3]), ElementsAre(0, 1, 2));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> no_input, PlayMode(kOneToAll, {}, 2));
  EXPECT_EQ(no_input.size(), 2u);
  EXPECT_THAT(
      PlayMode(kOneToAll, {Rows(0, 1), Rows(0, 1)}, 2),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ONE_TO_ALL takes one input, got 2")));
}

TEST(DispatchModeTest, RankZeroCallsOnlyRankZero) {
  int called = 0;
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> out,
                            PlayMode(kRankZero, {Rows(0, 2)}, 4, &called));
  EXPECT_EQ(called, 1);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_THAT(Values(out[0]), ElementsAre(0, 1));
}

TEST(DispatchModeTest, PerRankModesNeedOneInputPerRank) {
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> out,
                            PlayMode(kDpCompute, {Rows(0, 1), Rows(1, 2), Rows(2, 3)}, 3));
  EXPECT_THAT(Values(out[2]), ElementsAre(2));
  EXPECT_THAT(PlayMode(kDpCompute, {Rows(0, 1)}, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("DP_COMPUTE needs one input per rank (3), got 1")));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> all,
                            PlayMode(kAllToAll, {Rows(0, 1), Rows(5, 6)}, 2));
  EXPECT_THAT(Values(all[1]), ElementsAre(5));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> broadcast, PlayMode(kAllToAll, {Rows(7, 8)}, 2));
  EXPECT_THAT(Values(broadcast[1]), ElementsAre(7));
}

TEST(DispatchModeTest, DpComputeProtoPadsSplitsAndUnpads) {
  DRAY_ASSERT_OK_AND_ASSIGN(DispatchPlan plan, Mode(kDpComputeProto).dispatch({Rows(0, 10)}, {4}));
  EXPECT_EQ(plan.pad_size, 2);
  EXPECT_THAT(Values(*plan.per_rank[3]), ElementsAre(9, 0, 1));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> out,
                            PlayMode(kDpComputeProto, {Rows(0, 10)}, 4));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_THAT(Values(out[0]), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
  // Fewer rows than ranks, and no rows at all.
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> small,
                            PlayMode(kDpComputeProto, {Rows(0, 2)}, 4));
  EXPECT_THAT(Values(small[0]), ElementsAre(0, 1));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> empty,
                            PlayMode(kDpComputeProto, {Rows(0, 0)}, 4));
  EXPECT_EQ(empty[0].size(), 0);
}

TEST(DispatchModeTest, DpComputeProtoSplitsIndependentRowsUnevenlyWithoutPadding) {
  int called = 0;
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> one,
                            PlayMode(kDpComputeProto, {Rows(0, 1)}, 4, &called, true));
  EXPECT_EQ(called, 1);  // no rank runs rows it would throw away
  EXPECT_THAT(Values(one[0]), ElementsAre(0));
  DRAY_ASSERT_OK_AND_ASSIGN(DispatchPlan plan,
                            Mode(kDpComputeProto).dispatch({Rows(0, 5)}, {2, true}));
  EXPECT_EQ(plan.pad_size, 0);
  EXPECT_EQ(plan.per_rank[0]->size(), 3);  // the first ranks take the extra rows
  EXPECT_EQ(plan.per_rank[1]->size(), 2);
  DRAY_ASSERT_OK_AND_ASSIGN(plan, Mode(kDpComputeProto).dispatch({Rows(0, 1)}, {4, true}));
  EXPECT_NE(plan.per_rank[0], nullptr);
  EXPECT_EQ(plan.per_rank[3], nullptr);
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> five,
                            PlayMode(kDpComputeProto, {Rows(0, 5)}, 3, &called, true));
  EXPECT_EQ(called, 3);
  EXPECT_THAT(Values(five[0]), ElementsAre(0, 1, 2, 3, 4));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> none,
                            PlayMode(kDpComputeProto, {Rows(0, 0)}, 4, &called, true));
  EXPECT_EQ(called, 1);
  EXPECT_EQ(none[0].size(), 0);
  // DP_COMPUTE_METRIC keeps one output per rank: it pads whatever the rows.
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> metric,
                            PlayMode(kDpComputeMetric, {Rows(0, 1)}, 4, &called, true));
  EXPECT_EQ(called, 4);
}

TEST(DispatchModeTest, DpComputeProtoRejectsRanksThatDropRows) {
  DRAY_ASSERT_OK_AND_ASSIGN(DispatchPlan plan, Mode(kDpComputeProto).dispatch({Rows(0, 3)}, {4}));
  EXPECT_THAT(Mode(kDpComputeProto).collect({DataProto()}, plan),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one row per input row")));
}

TEST(DispatchModeTest, DpComputeMetricKeepsEveryRanksOutput) {
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> out,
                            PlayMode(kDpComputeMetric, {Rows(0, 3)}, 2));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_THAT(Values(out[1]), ElementsAre(2, 0));  // padding row kept: never trimmed
}

TEST(DispatchModeTest, RegistryAddsModesAndNamesUnknownOnes) {
  DispatchRegistry registry;
  DRAY_ASSERT_OK(registry.Register(DispatchMode{
      "LAST_RANK",
      [](std::vector<DataProto> inputs,
         const DispatchOptions& options) -> absl::StatusOr<DispatchPlan> {
        DispatchPlan plan{std::vector<std::shared_ptr<const DataProto>>(options.world_size), 0};
        plan.per_rank.back() = std::make_shared<const DataProto>(inputs.at(0));
        return plan;
      },
      [](std::vector<DataProto> outputs,
         const DispatchPlan&) -> absl::StatusOr<std::vector<DataProto>> { return outputs; }}));
  DRAY_ASSERT_OK_AND_ASSIGN(const DispatchMode* mode, registry.Find("LAST_RANK"));
  DRAY_ASSERT_OK_AND_ASSIGN(DispatchPlan plan, mode->dispatch({Rows(0, 1)}, {3}));
  EXPECT_EQ(plan.per_rank[0], nullptr);
  EXPECT_NE(plan.per_rank[2], nullptr);
  EXPECT_THAT(
      registry.Register(DispatchMode{std::string(kOneToAll), mode->dispatch, mode->collect}),
      StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(
      registry.Find("MEGATRON_PP"),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("known modes: ALL_TO_ALL, DP_COMPUTE,")));
  EXPECT_THAT(registry.Register(DispatchMode{"EMPTY", nullptr, nullptr}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace dray
