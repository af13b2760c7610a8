// SupervisedGroup over real worker processes: a killed worker's group is
// replaced (in the background, or when its owner asks), readied again, and
// given up after the restart budget; every process is reaped.
#include "runtime/controller/supervised_group.h"

#include <signal.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/runtime/test_util.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::HasSubstr;

// Options for two test workers, counting how often a group was readied.
SupervisedGroup::Options TwoWorkers(std::atomic<int>* readied) {
  SupervisedGroup::Options options;
  options.resources = {1, 2};
  options.group.command = {RunfilePath("tests/runtime/test_workers")};
  options.group.roles = {"test"};
  options.restart_backoff = absl::ZeroDuration();
  options.initialize = [readied](WorkerGroup& group) {
    ++*readied;
    return group.Call("identity", {});
  };
  return options;
}

TEST(SupervisedGroupTest, AKilledWorkersGroupIsReplacedInTheBackground) {
  std::atomic<int> readied{0};
  absl::Notification restarted;  // the second group is being readied
  SupervisedGroup::Options options = TwoWorkers(&readied);
  options.initialize = [&](WorkerGroup& group) {
    if (++readied == 2) restarted.Notify();
    return group.Call("identity", {});
  };
  DRAY_ASSERT_OK_AND_ASSIGN(std::unique_ptr<SupervisedGroup> supervised,
                            SupervisedGroup::Start(std::move(options)));
  EXPECT_EQ(readied, 1);
  EXPECT_EQ(supervised->init_results().size(), 2u);
  const std::shared_ptr<WorkerGroup> first = supervised->group();
  const std::vector<pid_t> old_pids = first->pids();
  ASSERT_EQ(kill(old_pids[1], SIGKILL), 0);
  restarted.WaitForNotification();
  DRAY_ASSERT_OK_AND_ASSIGN(std::shared_ptr<WorkerGroup> second,
                            supervised->AwaitServing(absl::Minutes(1)));
  EXPECT_NE(second.get(), first.get());
  EXPECT_EQ(supervised->restarts(), 1);
  EXPECT_EQ(readied, 2);
  DRAY_EXPECT_OK(second->Call("identity", {}).status());
  DRAY_EXPECT_OK(supervised->Health());
  for (pid_t pid : old_pids) EXPECT_FALSE(ProcessAlive(pid)) << pid;  // the failed group reaped
}

TEST(SupervisedGroupTest, GivesUpOnceTheRestartsAreUsedUp) {
  std::atomic<int> readied{0};
  SupervisedGroup::Options options = TwoWorkers(&readied);
  options.max_restarts = 0;
  DRAY_ASSERT_OK_AND_ASSIGN(std::unique_ptr<SupervisedGroup> supervised,
                            SupervisedGroup::Start(std::move(options)));
  const std::vector<pid_t> pids = supervised->group()->pids();
  ASSERT_EQ(kill(pids[0], SIGKILL), 0);
  EXPECT_TRUE(supervised->WaitUntilGivenUp(absl::Minutes(1)));
  EXPECT_THAT(supervised->Health(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("all 0 restarts are used up; last cause: worker rank 0")));
  EXPECT_THAT(supervised->Serving(), StatusIs(absl::StatusCode::kUnavailable));
  for (pid_t pid : pids) EXPECT_FALSE(ProcessAlive(pid)) << pid;
}

TEST(SupervisedGroupTest, WhenAskedTheOwnerRestartsAfterNoticingTheFailure) {
  std::atomic<int> readied{0};
  SupervisedGroup::Options options = TwoWorkers(&readied);
  options.restart = SupervisedGroup::Restart::kWhenAsked;
  options.max_restarts = 1;
  DRAY_ASSERT_OK_AND_ASSIGN(std::unique_ptr<SupervisedGroup> supervised,
                            SupervisedGroup::Start(std::move(options)));
  std::shared_ptr<WorkerGroup> first = supervised->group();
  ASSERT_EQ(kill(first->pids()[1], SIGKILL), 0);
  const absl::Status cause = supervised->HealthAfterFailure(absl::Minutes(1));
  EXPECT_THAT(cause, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("worker rank 1")));
  EXPECT_THAT(supervised->Serving(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("restarting after")));
  EXPECT_EQ(supervised->restarts(), 0) << "nothing restarts until asked";

  DRAY_EXPECT_OK(supervised->RestartNow(cause));
  EXPECT_EQ(supervised->restarts(), 1);
  EXPECT_EQ(readied, 2);
  DRAY_ASSERT_OK_AND_ASSIGN(std::shared_ptr<WorkerGroup> second, supervised->Serving());
  EXPECT_NE(second.get(), first.get());
  DRAY_EXPECT_OK(second->Call("identity", {}).status());

  // The budget is spent: the next failure is final.
  ASSERT_EQ(kill(second->pids()[0], SIGKILL), 0);
  const absl::Status again = supervised->HealthAfterFailure(absl::Minutes(1));
  EXPECT_THAT(supervised->RestartNow(again),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("all 1 restarts are used up")));
  EXPECT_TRUE(supervised->WaitUntilGivenUp(absl::ZeroDuration()));
}

TEST(SupervisedGroupTest, AfterStopNothingRestarts) {
  std::atomic<int> readied{0};
  DRAY_ASSERT_OK_AND_ASSIGN(std::unique_ptr<SupervisedGroup> supervised,
                            SupervisedGroup::Start(TwoWorkers(&readied)));
  supervised->Stop(absl::CancelledError("the server is shutting down"));
  EXPECT_THAT(supervised->Serving(),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("shutting down")));
  std::shared_ptr<WorkerGroup> group = supervised->group();
  ASSERT_EQ(kill(group->pids()[0], SIGKILL), 0);
  EXPECT_THAT(group->HealthAfterFailure(absl::Minutes(1)),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(supervised->Serving(), StatusIs(absl::StatusCode::kCancelled))
      << "Stop's reason stays";
  supervised.reset();  // joins the supervisor: it restarted nothing
  EXPECT_EQ(readied, 1);
}

TEST(SupervisedGroupTest, AFailedFirstStartIsStartsError) {
  SupervisedGroup::Options options;
  options.resources = {1, 1};
  options.group.command = {RunfilePath("tests/runtime/test_workers")};
  options.group.roles = {"test"};
  options.initialize = InitModel("model: none", absl::Minutes(1));  // the test worker has none
  EXPECT_THAT(SupervisedGroup::Start(std::move(options)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("init_model: ")));
}

}  // namespace
}  // namespace dray
