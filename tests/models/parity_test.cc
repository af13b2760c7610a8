// Parity with diffusers on every case in tests/data/reference/qwen_image, run
// through the same library as `dray parity`: scheduler schedules and Euler
// steps, pipeline helpers, transformer and VAE outputs, within the
// tolerances of the reference README.
#include "workers/parity/parity.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/models/reference.h"

namespace dray {

// PrintTo names a case in gtest's messages.
void PrintTo(const ParityCase& c, std::ostream* os) { *os << c.component << "/" << c.name; }

}  // namespace dray

namespace dray::qwen_image {
namespace {

class ParityTest : public ::testing::TestWithParam<ParityCase> {};

TEST_P(ParityTest, MatchesDiffusers) {
  const std::vector<ParityResult> results = RunParityCase(GetParam());
  ASSERT_FALSE(results.empty());
  for (const ParityResult& result : results) {
    RecordProperty(result.output, absl::StrCat(result.max_abs));
    EXPECT_TRUE(result.passed) << result.output << ": "
                               << (result.error.empty() ? "" : result.error + "; ") << "max abs "
                               << result.max_abs << ", max rel " << result.max_rel << " (atol "
                               << result.atol << ", rtol " << result.rtol << ")";
  }
}

std::vector<ParityCase> AllCases() {
  absl::StatusOr<std::vector<ParityCase>> cases = ListParityCases(ReferencePath(""));
  EXPECT_TRUE(cases.ok()) << cases.status();
  return cases.value_or(std::vector<ParityCase>{});
}

INSTANTIATE_TEST_SUITE_P(Reference, ParityTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<ParityCase>& info) {
                           return info.param.component + "_" + info.param.name;
                         });

TEST(ParityListTest, FindsEveryComponentOfTheReference) {
  const std::vector<ParityCase> cases = AllCases();
  std::set<std::string> components;
  for (const ParityCase& c : cases) components.insert(c.component);
  EXPECT_EQ(components,
            (std::set<std::string>{"helpers", "scheduler", "transformer_small", "transformer_tiny",
                                   "vae_default_small", "vae_tiny"}));
  EXPECT_EQ(cases.size(), 4u + 1u + 1u + 2u + 5u + 3u + 9u);  // as the reference README lists
}

}  // namespace
}  // namespace dray::qwen_image
