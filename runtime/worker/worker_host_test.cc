// WorkerHost in this process: finding methods across colocated roles,
// errors and exceptions kept per call, progress scoped to its call.
#include "runtime/worker/worker_host.h"

#include <stdexcept>

#include <c10/util/Exception.h>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

class Counter : public Worker {
 public:
  Counter() {
    Def("count", &Counter::Count, {kOneToAll});
    Def("fail", &Counter::Fail, {kOneToAll});
    Def("throw", &Counter::Throw, {kOneToAll});
    Def("check", &Counter::Check, {kOneToAll});
    MethodOptions per_row;
    per_row.dispatch_mode = kDpComputeProto;
    per_row.rows_independent = true;
    Def("shared", &Counter::Count, per_row);
    MethodOptions collective;
    collective.collective = true;
    Def("together", &Counter::SeeStop, collective);
  }
  absl::StatusOr<DataProto> Count() {
    for (int step = 1; step <= 2; ++step) {
      DRAY_RETURN_IF_ERROR(StopRequested());
      ReportProgress("count", step, 2);
    }
    return DataProto::Make({}, {}, {{"calls", ++calls_}});
  }
  // SeeStop starts and says whether it was asked to stop.
  absl::StatusOr<DataProto> SeeStop() {
    return DataProto::Make({}, {}, {{"stopped", StopRequested().ok() ? 0 : 1}});
  }
  absl::StatusOr<DataProto> Fail() { return absl::NotFoundError("nothing here"); }
  absl::StatusOr<DataProto> Throw() { throw std::runtime_error("broke"); }
  absl::StatusOr<DataProto> Check() {
    TORCH_CHECK(calls_ < 0, "shapes differ: 3 vs 4");
    return DataProto();
  }

 private:
  int64_t calls_ = 0;
};

class Other : public Worker {
 public:
  Other() { Def("shared", &Other::Shared, {kOneToAll}); }
  absl::StatusOr<DataProto> Shared() { return DataProto(); }
};

std::unique_ptr<WorkerHost> Host() {
  WorkerClassRegistry classes;
  classes.Add<Counter>("counter");
  classes.Add<Other>("other");
  return WorkerHost::Create(classes, {"counter", "other"}, /*rank=*/3).value();
}

TEST(WorkerHostTest, RunsMethodsOfEveryRoleAndKeepsState) {
  auto host = Host();
  DRAY_ASSERT_OK(host->Execute("", "count", DataProto()).status());
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto second, host->Execute("counter", "count", DataProto()));
  EXPECT_EQ(second.GetMeta<int64_t>("calls").value(), 2);
  DRAY_EXPECT_OK(host->Execute("other", "shared", DataProto()).status());
}

TEST(WorkerHostTest, ErrorsNameRankRoleAndMethodAndTheHostKeepsServing) {
  auto host = Host();
  EXPECT_THAT(host->Execute("", "fail", DataProto()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("rank 3, counter.fail: nothing")));
  EXPECT_THAT(
      host->Execute("", "throw", DataProto()),
      StatusIs(absl::StatusCode::kInternal, HasSubstr("rank 3, counter.throw threw: broke")));
  // LibTorch's errors reach the caller without their backtrace.
  EXPECT_THAT(
      host->Execute("", "check", DataProto()),
      StatusIs(absl::StatusCode::kInternal,
               AllOf(HasSubstr("shapes differ: 3 vs 4"), HasSubstr("(error 2 in rank 3's log)"),
                     Not(HasSubstr("Exception raised from")))));
  EXPECT_THAT(host->Execute("", "nope", DataProto()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("it has: counter.count")));
  DRAY_EXPECT_OK(host->Execute("", "count", DataProto()).status());
}

TEST(WorkerHostTest, ProgressGoesToTheRunningCallOnly) {
  auto host = Host();
  std::vector<std::string> seen;
  CallHooks hooks;
  hooks.progress = [&](const std::string& what, int64_t done, int64_t total) {
    seen.push_back(absl::StrCat(what, " ", done, "/", total));
  };
  DRAY_ASSERT_OK(host->Execute("", "count", DataProto(), hooks).status());
  EXPECT_THAT(seen, ElementsAre("count 1/2", "count 2/2"));
  DRAY_ASSERT_OK(host->Execute("", "count", DataProto()).status());  // no sink: dropped
  EXPECT_EQ(seen.size(), 2u);
}

TEST(WorkerHostTest, AStopRequestEndsTheCallWithItsReason) {
  auto host = Host();
  int checks = 0;
  CallHooks hooks;
  hooks.stop = [&]() {
    return ++checks < 2 ? absl::OkStatus() : absl::CancelledError("the caller gave up");
  };
  EXPECT_THAT(host->Execute("", "count", DataProto(), hooks),
              StatusIs(absl::StatusCode::kCancelled,
                       AllOf(HasSubstr("rank 3, counter.count"), HasSubstr("the caller gave up"))));
  EXPECT_EQ(checks, 2);
  DRAY_EXPECT_OK(host->Execute("", "count", DataProto()).status());  // no stop: runs through
}

TEST(WorkerHostTest, AStoppedCallStartsOnlyIfItsMethodIsCollective) {
  auto host = Host();
  CallHooks cancelled;
  cancelled.stop = [] { return absl::CancelledError("the caller gave up"); };
  EXPECT_THAT(host->Execute("", "count", DataProto(), cancelled),
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr("rank 3, counter.count: not started: the caller gave up")));
  // Its group's other ranks may have started: it starts, to stop with them.
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto seen, host->Execute("", "together", DataProto(), cancelled));
  EXPECT_EQ(seen.GetMeta<int64_t>("stopped").value(), 1);
}

TEST(WorkerHostTest, DescribePublishesEveryMethodWithItsOptions) {
  const v1::MethodTable table = Host()->Describe();
  EXPECT_EQ(table.rank(), 3);
  std::vector<std::string> names;
  for (const v1::MethodInfo& info : table.methods()) {
    names.push_back(absl::StrCat(info.role(), ".", info.name()));
    if (info.role() == "counter" && info.name() == "shared") {
      EXPECT_EQ(info.dispatch_mode(), kDpComputeProto);
      EXPECT_TRUE(info.rows_independent());
    }
  }
  EXPECT_THAT(names, ElementsAre("counter.count", "counter.fail", "counter.throw", "counter.check",
                                 "counter.shared", "counter.together", "other.shared"));
}

TEST(WorkerHostTest, RolesMustBeKnownAndDistinct) {
  WorkerClassRegistry classes;
  classes.Add<Counter>("counter");
  EXPECT_THAT(WorkerHost::Create(classes, {"counter", "counter"}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("listed twice")));
  EXPECT_THAT(WorkerHost::Create(classes, {"missing"}, 0), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace dray
