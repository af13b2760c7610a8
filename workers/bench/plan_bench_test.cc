#include "workers/bench/plan_bench.h"

#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace dray {
namespace {

// Ratios of bytes, not timings: each is deterministic for the case.
TEST(PlanBenchTest, EveryMeasuredPeakIsWithinFifteenPercentOfThePlan) {
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<PlanCheck> checks, RunPlanChecks(/*quick=*/false, {}));
  EXPECT_EQ(checks.size(), 22u);
  for (const PlanCheck& check : checks) {
    EXPECT_GT(check.ratio(), 0.85)
        << check.name << ": " << check.measured << " measured, " << check.predicted << " predicted";
    EXPECT_LT(check.ratio(), 1.15)
        << check.name << ": " << check.measured << " measured, " << check.predicted << " predicted";
  }
}

}  // namespace
}  // namespace dray
