// Parity with flow_grpo on every case in tests/data/reference/flow_grpo and
// grpo_guard (GRPO-Guard's step and loss), and with DanceGRPO, DiffusionNFT,
// MixGRPO, Diffusion-DPO and DMD2 on theirs, run
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
#include "workers/parity/dmd2_parity.h"
#include "workers/parity/dpo_parity.h"
#include "workers/parity/mix_grpo_parity.h"
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

std::vector<ParityCase> AllCases() {
  std::vector<ParityCase> cases = FlowGrpoParityCases(ReferenceDir("flow_grpo"));
  for (const char* folder : {"grpo_guard", "dance_grpo", "diffusion_nft"}) {
    for (ParityCase& c : FlowGrpoParityCases(ReferenceDir(folder))) cases.push_back(c);
  }
  for (ParityCase& c : MixGrpoParityCases(ReferenceDir("mix_grpo"))) cases.push_back(c);
  for (ParityCase& c : DpoParityCases(ReferenceDir("flow_dpo"))) cases.push_back(c);
  for (ParityCase& c : Dmd2ParityCases(ReferenceDir("dmd2"))) cases.push_back(c);
  return cases;
}

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
  for (const ParityCase& c : AllCases())
    ++kinds[c.component + "/" + c.name.substr(0, c.name.find('.'))];
  // As the references' READMEs list: 62 SDE steps, 4 advantages, 4 losses, 2
  // rollouts; 8 GRPO-Guard steps and losses; DanceGRPO's 2 schedules, 16
  // steps, 7 advantages and its training chain; DiffusionNFT's 11
  // losses, 3 decay schedules and 7 sampling-policy updates; MixGRPO's 6
  // window tables (not its numpy-random one), 18 of its steps (not its 2 bfloat16 ones: see
  // mix_grpo_parity.h) and 4 of DanceGRPO's copy, 3 rollouts, 4 losses and 5
  // advantages; Diffusion-DPO's 3 flow-matching and 3 epsilon losses and
  // flow_grpo's 2 choices of pairs; DMD2's 3 distribution-matching, 1
  // fake-score and 4 GAN losses and 5 backward simulations.
  EXPECT_EQ(kinds, (std::map<std::string, int>{{"dance_grpo/adv", 7},
                                               {"dance_grpo/flux", 16},
                                               {"dance_grpo/schedule", 2},
                                               {"dance_grpo/train", 1},
                                               {"diffusion_nft/nft", 11},
                                               {"diffusion_nft/old_update", 7},
                                               {"diffusion_nft/return_decay", 3},
                                               {"diffusion_nft/sampling", 5},
                                               {"dmd2/backsim", 5},
                                               {"dmd2/dm", 3},
                                               {"dmd2/fake", 1},
                                               {"dmd2/gan", 4},
                                               {"flow_dpo/diffusion_dpo", 3},
                                               {"flow_dpo/flow_dpo", 3},
                                               {"flow_dpo/tracker", 2},
                                               {"flow_grpo/adv", 4},
                                               {"flow_grpo/loss", 4},
                                               {"flow_grpo/rollout", 2},
                                               {"flow_grpo/sde", 62},
                                               {"grpo_guard/guard", 8},
                                               {"mix_grpo/adv", 5},
                                               {"mix_grpo/dance_grpo_step", 4},
                                               {"mix_grpo/flow_grpo_step", 18},
                                               {"mix_grpo/loss", 4},
                                               {"mix_grpo/rollout", 3},
                                               {"mix_grpo/states", 6}}));
}

TEST(FlowGrpoParityListTest, DrayParityFindsTheFolderAndItsParent) {
  absl::StatusOr<std::vector<ParityCase>> direct = ListParityCases(ReferenceDir("flow_grpo"));
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(direct->size(), FlowGrpoParityCases(ReferenceDir("flow_grpo")).size());
}

}  // namespace
}  // namespace dray::rl
