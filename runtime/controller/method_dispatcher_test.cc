// The controller's dispatch, collect and failure logic over fake workers:
// no processes, no sockets, milliseconds.
#include "runtime/controller/method_dispatcher.h"

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "dispatch/dispatch_mode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/controller/fake_worker_connection.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::HasSubstr;

v1::MethodInfo Method(const std::string& role, const std::string& name, const char* mode,
                      bool rank_zero = false, bool blocking = true) {
  v1::MethodInfo info;
  info.set_role(role);
  info.set_name(name);
  info.set_dispatch_mode(mode);
  info.set_execute_mode(rank_zero ? v1::EXECUTE_MODE_RANK_ZERO : v1::EXECUTE_MODE_ALL);
  info.set_blocking(blocking);
  return info;
}

// Doubles column "x" and records the rank that ran each row.
FakeWorkerConnection::Answer Doubler(int rank) {
  return [rank](const std::string&, const DataProto& input) -> absl::StatusOr<DataProto> {
    DRAY_ASSIGN_OR_RETURN(at::Tensor x, input.GetTensor("x"));
    return DataProto::Make({{"y", x * 2}, {"rank", at::full_like(x, rank)}});
  };
}

DataProto Rows(int64_t n) { return DataProto::Make({{"x", at::arange(n)}}).value(); }

const std::vector<v1::MethodInfo> kMethods = {
    Method("math", "double", kDpComputeProto),
    Method("math", "init_model", kOneToAll),
    Method("math", "ping", kOneToAll, /*rank_zero=*/true),
    Method("math", "slow", kOneToAll, false, /*blocking=*/false),
    Method("other", "init_model", kOneToAll),
};

TEST(MethodDispatcherTest, DpComputeProtoSplitsPadsAndJoinsInOrder) {
  FakeWorkerConnection rank0(Doubler(0)), rank1(Doubler(1));
  MethodDispatcher dispatcher(kMethods, {&rank0, &rank1});
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> out,
                            dispatcher.Invoke("double", {Rows(5)}, absl::InfiniteFuture()).Get());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(at::equal(out[0].GetTensor("y").value(), at::arange(5) * 2));
  EXPECT_TRUE(
      at::equal(out[0].GetTensor("rank").value(), at::tensor({0, 0, 0, 1, 1}).to(at::kLong)));
  EXPECT_EQ(rank0.calls()[0].input->size(), 3);
  EXPECT_EQ(rank1.calls()[0].input->size(), 3);  // padded
  EXPECT_EQ(rank0.calls()[0].role, "math");
}

TEST(MethodDispatcherTest, TrafficCountsEachRanksInputAndResult) {
  FakeWorkerConnection rank0(Doubler(0)), rank1(Doubler(1));
  MethodDispatcher dispatcher(kMethods, {&rank0, &rank1});
  DRAY_ASSERT_OK(dispatcher.Invoke("double", {Rows(4)}, absl::InfiniteFuture()).Get().status());
  EXPECT_EQ(dispatcher.traffic().sent_bytes, 4 * 8);          // two rows of int64 to each
  EXPECT_EQ(dispatcher.traffic().received_bytes, 2 * 4 * 8);  // y and rank, by row
  DRAY_ASSERT_OK(
      dispatcher.Invoke("math.init_model", {Rows(1)}, absl::InfiniteFuture()).Get().status());
  EXPECT_EQ(dispatcher.traffic().sent_bytes, 4 * 8 + 2 * 8) << "a shared input, once per rank";
}

TEST(MethodDispatcherTest, IndependentRowsSplitUnevenlyUnlessTheCallNeedsEqualShards) {
  std::vector<v1::MethodInfo> methods = kMethods;
  methods[0].set_rows_independent(true);
  FakeWorkerConnection rank0(Doubler(0)), rank1(Doubler(1)), rank2(Doubler(2));
  MethodDispatcher dispatcher(methods, {&rank0, &rank1, &rank2});
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> out,
                            dispatcher.Invoke("double", {Rows(1)}, absl::InfiniteFuture()).Get());
  EXPECT_EQ(out[0].size(), 1);
  EXPECT_EQ(rank0.calls().size(), 1u);  // one row: one call
  EXPECT_TRUE(rank1.calls().empty());
  CallOptions sharded;
  sharded.equal_shards = true;
  DRAY_ASSERT_OK_AND_ASSIGN(
      out, dispatcher.Invoke("double", {Rows(1)}, absl::InfiniteFuture(), sharded).Get());
  EXPECT_EQ(out[0].size(), 1);  // padding rows removed
  EXPECT_EQ(rank2.calls().size(), 1u);
}

// Groups of ranks that edit the same rows together (CFG branches, sequence
// parts): rows split among the groups, each group's ranks given one input,
// the first rank of each group answering for it.
TEST(MethodDispatcherTest, RankGroupsShareTheirRowsAndTheFirstRankAnswers) {
  std::vector<v1::MethodInfo> methods = kMethods;
  methods[0].set_rows_independent(true);
  FakeWorkerConnection rank0(Doubler(0)), rank1(Doubler(1)), rank2(Doubler(2)), rank3(Doubler(3));
  MethodDispatcher dispatcher(methods, {&rank0, &rank1, &rank2, &rank3});
  CallOptions grouped;
  grouped.rank_group_size = 2;
  DRAY_ASSERT_OK_AND_ASSIGN(
      std::vector<DataProto> out,
      dispatcher.Invoke("double", {Rows(3)}, absl::InfiniteFuture(), grouped).Get());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(at::equal(out[0].GetTensor("y").value(), at::arange(3) * 2));
  EXPECT_TRUE(at::equal(out[0].GetTensor("rank").value(), at::tensor({0, 0, 2}).to(at::kLong)));
  EXPECT_EQ(rank0.calls()[0].wire, rank1.calls()[0].wire);
  EXPECT_EQ(rank2.calls()[0].wire, rank3.calls()[0].wire);
  EXPECT_EQ(rank3.calls()[0].input->size(), 1);

  // One row: the first group alone.
  DRAY_ASSERT_OK_AND_ASSIGN(
      out, dispatcher.Invoke("double", {Rows(1)}, absl::InfiniteFuture(), grouped).Get());
  EXPECT_EQ(out[0].size(), 1);
  EXPECT_EQ(rank1.calls().size(), 2u);
  EXPECT_EQ(rank3.calls().size(), 1u);

  grouped.rank_group_size = 3;
  EXPECT_THAT(dispatcher.Invoke("double", {Rows(3)}, absl::InfiniteFuture(), grouped).Get(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank groups of 3 do not divide a group of 4")));
}

TEST(MethodDispatcherTest, OneToAllEncodesTheInputOnce) {
  FakeWorkerConnection rank0(Doubler(0)), rank1(Doubler(1)), rank2(Doubler(2));
  MethodDispatcher dispatcher(kMethods, {&rank0, &rank1, &rank2});
  DRAY_ASSERT_OK_AND_ASSIGN(
      std::vector<DataProto> out,
      dispatcher.Invoke("math.init_model", {Rows(2)}, absl::InfiniteFuture()).Get());
  EXPECT_EQ(out.size(), 3u);
  EXPECT_EQ(rank0.calls()[0].wire, rank2.calls()[0].wire);
}

TEST(MethodDispatcherTest, RankZeroMethodsRunOnRankZeroOnly) {
  FakeWorkerConnection rank0(Doubler(0)), rank1(Doubler(1));
  MethodDispatcher dispatcher(kMethods, {&rank0, &rank1});
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> out,
                            dispatcher.Invoke("ping", {Rows(1)}, absl::InfiniteFuture()).Get());
  EXPECT_EQ(out.size(), 1u);
  EXPECT_EQ(rank0.calls().size(), 1u);
  EXPECT_TRUE(rank1.calls().empty());
}

TEST(MethodDispatcherTest, TheFirstErrorEndsTheWaitWithoutTheOtherRanks) {
  FakeWorkerConnection rank0;  // never answers
  FakeWorkerConnection rank1([](const std::string&, const DataProto&) -> absl::StatusOr<DataProto> {
    return absl::UnavailableError("worker rank 1 (pid 7) killed by signal 9");
  });
  MethodDispatcher dispatcher(kMethods, {&rank0, &rank1});
  GroupFuture future = dispatcher.Invoke("slow", {Rows(1)}, absl::InfiniteFuture());
  EXPECT_TRUE(future.Ready());
  EXPECT_THAT(future.Get(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("rank 1")));
  // Rank 0's late answer changes nothing.
  rank0.calls()[0].result->Set(Rows(1));
  EXPECT_THAT(future.Get(), StatusIs(absl::StatusCode::kUnavailable));
}

TEST(MethodDispatcherTest, NonBlockingMethodsReturnBeforeTheResult) {
  FakeWorkerConnection rank0;
  MethodDispatcher dispatcher(kMethods, {&rank0});
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  GroupFuture future = dispatcher.Invoke("slow", {Rows(1)}, deadline);
  EXPECT_FALSE(future.Ready());
  EXPECT_EQ(rank0.calls()[0].deadline, deadline);
  rank0.calls()[0].result->Set(Rows(1));
  EXPECT_TRUE(future.Ready());
  DRAY_EXPECT_OK(future.Get().status());
}

TEST(MethodDispatcherTest, ProgressReachesTheCallerWithItsRank) {
  FakeWorkerConnection rank0, rank1;
  MethodDispatcher dispatcher(kMethods, {&rank0, &rank1});
  std::vector<std::string> seen;
  CallOptions call;
  call.on_progress = [&](int rank, const std::string& what, int64_t done, int64_t total) {
    seen.push_back(absl::StrCat(rank, ":", what, " ", done, "/", total));
  };
  GroupFuture future = dispatcher.Invoke("slow", {Rows(1)}, absl::InfiniteFuture(), call);
  rank1.calls()[0].on_progress("steps", 1, 2);
  rank0.calls()[0].on_progress("steps", 2, 2);
  EXPECT_EQ(seen, (std::vector<std::string>{"1:steps 1/2", "0:steps 2/2"}));
  // Without a listener the calls carry none.
  dispatcher.Invoke("slow", {Rows(1)}, absl::InfiniteFuture());
  EXPECT_FALSE(rank0.calls()[1].on_progress);
}

TEST(MethodDispatcherTest, UnknownAndAmbiguousMethodsNameTheKnownOnes) {
  FakeWorkerConnection rank0(Doubler(0));
  MethodDispatcher dispatcher(kMethods, {&rank0});
  EXPECT_THAT(
      dispatcher.Invoke("triple", {Rows(1)}, absl::InfiniteFuture()).Get(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("it has: math.double, math.init_model")));
  EXPECT_THAT(
      dispatcher.Invoke("init_model", {Rows(1)}, absl::InfiniteFuture()).Get(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("call it as math.init_model")));
  EXPECT_TRUE(rank0.calls().empty());
}

TEST(MethodDispatcherTest, BadInputsFailBeforeAnyCall) {
  FakeWorkerConnection rank0(Doubler(0)), rank1(Doubler(1));
  MethodDispatcher dispatcher(kMethods, {&rank0, &rank1});
  EXPECT_THAT(
      dispatcher.Invoke("double", {Rows(1), Rows(1), Rows(1)}, absl::InfiniteFuture()).Get(),
      StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(rank0.calls().empty());
}

}  // namespace
}  // namespace dray
