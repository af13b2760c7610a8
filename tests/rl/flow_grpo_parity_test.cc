// Parity with flow_grpo on every case in tests/data/reference/flow_grpo, run
// through the same library as `dray parity`: the SDE step and log-probability
// (sde and cps, rollout and recompute with gradients, float32 and float64),
// advantages, the GRPO loss with KL and gradients, and two Edit-Plus rollouts
// (dray's Edit-Plus pipeline around the reference's toy transformer) with
// their training steps, within each case's tolerance.
#include "workers/parity/flow_grpo_parity.h"

#include <cctype>
#include <map>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/models/reference.h"
#include "workers/parity/parity.h"

namespace dray {

// PrintTo names a case in gtest's messages.
void PrintTo(const ParityCase& c, std::ostream* os) { *os << c.component << "/" << c.name; }

}  // namespace dray

namespace dray::rl {
namespace {

class FlowGrpoParityTest : public ::testing::TestWithParam<ParityCase> {};

TEST_P(FlowGrpoParityTest, MatchesFlowGrpo) {
  const std::vector<ParityResult> results = RunParityCase(GetParam());
  ASSERT_FALSE(results.empty());
  for (const ParityResult& result : results) {
    EXPECT_TRUE(result.passed) << result.output << ": "
                               << (result.error.empty() ? "" : result.error + "; ") << "max abs "
                               << result.max_abs << ", max rel " << result.max_rel << " (atol "
                               << result.atol << ", rtol " << result.rtol << ")";
  }
}

std::vector<ParityCase> AllCases() { return FlowGrpoParityCases(ReferenceDir("flow_grpo")); }

std::string TestName(const ::testing::TestParamInfo<ParityCase>& info) {
  std::string name = info.param.name;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Reference, FlowGrpoParityTest, ::testing::ValuesIn(AllCases()), TestName);

TEST(FlowGrpoParityListTest, FindsEveryCaseOfTheReference) {
  std::map<std::string, int> kinds;
  for (const ParityCase& c : AllCases()) ++kinds[c.name.substr(0, c.name.find('.'))];
  // As the reference README lists: 62 SDE steps, 4 advantages, 4 losses, 2 rollouts.
  EXPECT_EQ(kinds,
            (std::map<std::string, int>{{"adv", 4}, {"loss", 4}, {"rollout", 2}, {"sde", 62}}));
}

TEST(FlowGrpoParityListTest, DrayParityFindsTheFolderAndItsParent) {
  absl::StatusOr<std::vector<ParityCase>> direct = ListParityCases(ReferenceDir("flow_grpo"));
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(direct->size(), AllCases().size());
}

}  // namespace
}  // namespace dray::rl
