#include "runtime/worker/worker_process.h"

#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(WorkerProcessFlagsTest, ReadsControllerRolesAndHost) {
  DRAY_ASSERT_OK_AND_ASSIGN(WorkerProcessOptions options,
                            ParseWorkerProcessFlags({"--controller=10.0.0.1:4000",
                                                     "--roles=actor,ref", "--host=10.0.0.2"}));
  EXPECT_EQ(options.controller_address, "10.0.0.1:4000");
  EXPECT_THAT(options.roles, ElementsAre("actor", "ref"));
  EXPECT_EQ(options.host, "10.0.0.2");
}

TEST(WorkerProcessFlagsTest, RejectsUnknownAndMissingFlags) {
  EXPECT_THAT(ParseWorkerProcessFlags({"--controller=a:1", "--roles=x", "--rank=3"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'--rank=3'")));
  EXPECT_THAT(ParseWorkerProcessFlags({"--roles=x"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--controller")));
  EXPECT_THAT(ParseWorkerProcessFlags({"--controller=a:1", "--roles="}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--roles")));
}

}  // namespace
}  // namespace dray
