// The RL numerics beyond the reference cases: the on-policy identity (a
// recomputed step scores exactly what the rollout scored), the plain Euler
// step at noise level 0, and clear errors for bad schedules, windows,
// shapes and names.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "workers/rl/advantages.h"
#include "workers/rl/dmd2.h"
#include "workers/rl/nft_loss.h"
#include "workers/rl/ode_sampler.h"
#include "workers/rl/policy_loss.h"
#include "workers/rl/sde_sampler.h"
#include "workers/rl/sde_step.h"

namespace dray::rl {
namespace {

using ::dray::testing::StatusIs;
using ::testing::HasSubstr;

// Schedule: a 6-step linear schedule from 1 to 0.
SdeSchedule Schedule() {
  const at::Tensor sigmas = at::linspace(1.0, 0.0, 7, at::kFloat);
  return {sigmas, (sigmas.narrow(0, 0, 6) * 1000).to(at::kFloat)};
}

// Velocity: a deterministic stand-in model, nonlinear in the latents.
absl::StatusOr<at::Tensor> Velocity(const at::Tensor& latents, const at::Tensor& timestep) {
  return at::tanh(latents) * 0.5 + timestep.view({-1, 1, 1}) / 1000;
}

TEST(SdeSamplerTest, RecomputedStepsScoreWhatTheRolloutScored) {
  const SdeSchedule schedule = Schedule();
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor start = at::randn({3, 4, 8}, generator, at::kFloat);
  const SdeSamplerOptions options{0.7, SdeType::kSde, {1, 5}};
  DRAY_ASSERT_OK_AND_ASSIGN(Trajectory trajectory,
                            SampleTrajectory(
                                schedule, start, Velocity,
                                [&](int) {
                                  return at::randn({3, 4, 8}, generator, at::kFloat);
                                },
                                options));
  ASSERT_EQ(trajectory.log_probs.sizes(), (std::vector<int64_t>{3, 4}));
  for (int64_t j = 0; j < 4; ++j) {
    DRAY_ASSERT_OK_AND_ASSIGN(SdeStepResult step,
                              RecomputeStep(schedule, Velocity, trajectory, j, options));
    const at::Tensor ratio = at::exp(step.log_prob - trajectory.log_probs.select(1, j));
    EXPECT_LT((ratio - 1).abs().max().item<double>(), 1e-6) << "window step " << j;
  }
  // Each row at a step of its own scores what its row scored at that step.
  const at::Tensor own = at::tensor(std::vector<int64_t>{3, 0, 2}, at::kLong);
  DRAY_ASSERT_OK_AND_ASSIGN(SdeStepResult rows,
                            RecomputeStep(schedule, Velocity, trajectory, own, options));
  EXPECT_TRUE(at::allclose(rows.log_prob, AtSteps(trajectory.log_probs, own), 1e-5, 1e-6));
  EXPECT_THAT(RecomputeStep(schedule, Velocity, trajectory,
                            at::tensor(std::vector<int64_t>{0, 4, 1}, at::kLong), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kept steps")));
}

TEST(SdeSamplerTest, AnEmptyWindowIsEveryStepEuler) {
  const SdeSchedule schedule = Schedule();
  const at::Tensor start = at::ones({2, 4, 8}, at::kFloat);
  auto zeros = [](int) { return at::zeros({2, 4, 8}, at::kFloat); };
  DRAY_ASSERT_OK_AND_ASSIGN(Trajectory empty, SampleTrajectory(schedule, start, Velocity, zeros,
                                                               {0.7, SdeType::kSde, {3, 3}}));
  EXPECT_EQ(empty.log_probs.sizes(), (std::vector<int64_t>{2, 0}));
  DRAY_ASSERT_OK_AND_ASSIGN(Trajectory ode, SampleTrajectory(schedule, start, Velocity, zeros,
                                                             {0.0, SdeType::kSde, {0, 5}}));
  EXPECT_TRUE(at::allclose(empty.final_latents, ode.final_latents));
}

// The GRPO loss of recomputed steps, with its KL term, as a function of a
// tiny model's weights, in float64: autograd's gradient equals central
// finite differences.
TEST(GrpoLossTest, GradientMatchesFiniteDifferences) {
  SdeSchedule schedule = Schedule();
  schedule.sigmas = schedule.sigmas.to(at::kDouble);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(11);
  const at::Tensor weights = at::randn({8, 8}, generator, at::kDouble) * 0.3;
  const at::Tensor reference = weights + 0.05 * at::randn({8, 8}, generator, at::kDouble);
  auto model = [](const at::Tensor& w) -> PredictVelocity {
    return
        [w](const at::Tensor& latents, const at::Tensor& timestep) -> absl::StatusOr<at::Tensor> {
          return at::matmul(latents, w.t()) * (timestep.to(at::kDouble) / 1000).view({-1, 1, 1}) +
                 at::tanh(latents);
        };
  };
  const SdeSamplerOptions options{0.7, SdeType::kSde, {1, 4}};
  DRAY_ASSERT_OK_AND_ASSIGN(
      Trajectory trajectory,
      SampleTrajectory(
          schedule, at::randn({3, 4, 8}, generator, at::kDouble), model(weights),
          [&](int) {
            return at::randn({3, 4, 8}, generator, at::kDouble);
          },
          options));
  const at::Tensor advantages = at::tensor({1.5, -0.5, -1.0}, at::kDouble);
  DRAY_ASSERT_OK_AND_ASSIGN(PolicyLoss grpo, FindPolicyLoss("grpo"));
  const PolicyLossOptions loss_options{1e-4, 5.0, 0.04, 3};
  auto loss = [&](const at::Tensor& w) {
    at::Tensor total = at::zeros({}, at::kDouble);
    for (int64_t j = 0; j < 3; ++j) {
      const SdeStepResult policy =
          RecomputeStep(schedule, model(w), trajectory, j, options).value();
      const SdeStepResult ref =
          RecomputeStep(schedule, model(reference), trajectory, j, options).value();
      total = total + grpo({advantages, policy.log_prob, trajectory.log_probs.select(1, j),
                            policy.prev_sample_mean, ref.prev_sample_mean, policy.std_dev_t},
                           loss_options)
                          .value()
                          .loss;
    }
    return total;
  };
  const at::Tensor w = weights.clone().requires_grad_(true);
  loss(w).backward();
  const at::Tensor analytic = w.grad();
  at::Tensor numeric = at::zeros_like(weights);
  constexpr double kStep = 1e-6;
  for (int64_t i = 0; i < weights.numel(); ++i) {
    at::Tensor up = weights.clone(), down = weights.clone();
    up.view(-1)[i] += kStep;
    down.view(-1)[i] -= kStep;
    numeric.view(-1)[i] = (loss(up) - loss(down)).item<double>() / (2 * kStep);
  }
  EXPECT_GT(analytic.abs().max().item<double>(), 1e-6);
  EXPECT_LT((analytic - numeric).abs().max().item<double>(),
            1e-6 * analytic.abs().max().item<double>() + 1e-10);
}

TEST(SdeStepTest, NoiseLevelZeroIsTheEulerStep) {
  const SdeSchedule schedule = Schedule();
  const at::Tensor x = at::ones({2, 3, 4}), v = at::full({2, 3, 4}, 0.5);
  SdeStepInput input{v, schedule.timesteps.narrow(0, 2, 1).expand({2}).contiguous(), x, 0.0};
  input.noise = at::randn({2, 3, 4});
  DRAY_ASSERT_OK_AND_ASSIGN(SdeStepResult step, SdeStep(schedule, input));
  const double dt = schedule.sigmas[3].item<double>() - schedule.sigmas[2].item<double>();
  EXPECT_TRUE(at::allclose(step.prev_sample, x + dt * v));
}

TEST(SdeStepTest, RefusesATimestepOutsideTheSchedule) {
  SdeStepInput input{at::zeros({1, 2, 2}), at::tensor({999.5f}), at::zeros({1, 2, 2}), 0.7};
  input.noise = at::zeros({1, 2, 2});
  EXPECT_THAT(SdeStep(Schedule(), input).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timestep 999.5")));
}

TEST(SdeStepTest, RefusesMismatchedShapes) {
  SdeStepInput input{at::zeros({1, 2, 2}), at::tensor({1000.0f}), at::zeros({1, 2, 3}), 0.7};
  input.noise = at::zeros({1, 2, 3});
  EXPECT_THAT(SdeStep(Schedule(), input).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[1, 2, 2]")));
}

TEST(SdeSamplerTest, RefusesAWindowOutsideTheSchedule) {
  const at::Tensor start = at::zeros({1, 2, 2});
  EXPECT_THAT(SampleTrajectory(Schedule(), start, Velocity, [&](int) { return start; },
                               {0.7, SdeType::kSde, {3, 9}})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[3, 9)")));
}

TEST(RegistryTest, NamesWhatIsRegistered) {
  EXPECT_THAT(AdvantageEstimatorNames(), ::testing::ElementsAre("dance_grpo", "global", "grpo"));
  EXPECT_THAT(
      FindAdvantageEstimator("dance").status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("registered: dance_grpo, global, grpo")));
  EXPECT_THAT(FindPolicyLoss("nft").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("registered: grpo, grpo_guard")));
  EXPECT_THAT(ParseSdeType("ode").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sde, cps")));
}

TEST(PolicyLossTest, GrpoGuardNeedsTheRolloutsStepMean) {
  DRAY_ASSERT_OK_AND_ASSIGN(PolicyLoss guard, FindPolicyLoss("grpo_guard"));
  PolicyLossInput input{at::zeros({2}),    at::zeros({2}), at::zeros({2}),
                        at::zeros({2, 3}), at::Tensor(),   at::ones({2, 1})};
  EXPECT_THAT(guard(input, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("old_prev_sample_mean")));
  input.old_prev_sample_mean = at::zeros({2, 3});
  input.sqrt_neg_dt = at::ones({2, 1});
  DRAY_ASSERT_OK_AND_ASSIGN(PolicyLossOutput out, guard(input, {}));
  EXPECT_EQ(out.ratio.sum().item<double>(), 2.0);  // on-policy: the bias is 0, the ratio 1
}

TEST(PolicyLossTest, ImportanceWeightsScaleEachSamplesSurrogate) {
  DRAY_ASSERT_OK_AND_ASSIGN(PolicyLoss grpo, FindPolicyLoss("grpo"));
  PolicyLossInput input{at::tensor({1.0, -2.0}, at::kDouble), at::zeros({2}), at::zeros({2})};
  input.is_weight = at::tensor({0.5, 2.0}, at::kDouble);
  DRAY_ASSERT_OK_AND_ASSIGN(PolicyLossOutput out, grpo(input, {}));
  EXPECT_DOUBLE_EQ(out.policy_loss.item<double>(), (-1.0 * 0.5 + 2.0 * 2.0) / 2);  // ratio 1
  input.is_weight = at::ones({3});
  EXPECT_THAT(grpo(input, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is_weight must be [B]")));
}

TEST(OdeSamplerTest, RefusesWhatItCannotRun) {
  EXPECT_THAT(ParseOdeSolver("dpm3").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("flow or dpm2")));
  SdeSchedule schedule = Schedule();
  schedule.sigmas = schedule.sigmas.narrow(0, 0, schedule.sigmas.size(0) - 1);
  EXPECT_THAT(SampleOde(schedule, at::zeros({1, 4, 2}), Velocity, OdeSolver::kDpm2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sigmas")));
}

TEST(NftLossTest, RefusesWhatItCannotUse) {
  const at::Tensor x = at::zeros({2, 3});
  NftLossInput input{x, x, at::ones({2}), at::zeros({2}), x, x, x};
  NftLossOptions options;
  options.adv_mode = "best_only";
  EXPECT_THAT(NftLoss(input, options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("adv_mode 'best_only'")));
  input.t = at::ones({3});
  EXPECT_THAT(NftLoss(input, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("t and advantages be [B]")));
  EXPECT_THAT(NftOldPolicyDecay(10, 3).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("decay_type 3")));
}

TEST(Dmd2Test, VelocityParametrizationRecoversTheCleanLatents) {
  const ScoreParametrization flow = ScoreParametrization::Velocity(at::linspace(0.001, 1.0, 1000));
  const at::Tensor x0 = at::randn({3, 4, 5}, at::kDouble);
  const at::Tensor noise = at::randn({3, 4, 5}, at::kDouble);
  const at::Tensor t = at::tensor({0L, 500L, 999L});
  const at::Tensor xt = flow.Noised(x0, noise, t);
  EXPECT_TRUE(at::allclose(flow.CleanPrediction(xt, flow.Target(x0, noise), t), x0));
  // The last train timestep is pure noise: the generator's input is the noise itself.
  EXPECT_TRUE(at::equal(GeneratorInput(flow, x0, noise, 999), noise));
}

TEST(Dmd2Test, ASampleTheTeacherReproducesGetsAFiniteGradient) {
  const at::Tensor x0 = at::ones({2, 3}).requires_grad_(true);
  const at::Tensor real = at::stack({at::ones({3}), at::zeros({3})});  // row 0: |p_real| = 0
  DRAY_ASSERT_OK_AND_ASSIGN(DistributionMatching dm,
                            DistributionMatchingLoss(x0, real, at::full({2, 3}, 0.5)));
  EXPECT_TRUE(at::allclose(dm.grad[0], at::full({3}, -0.5 / kNormalizerFloor, dm.grad.options())));
  dm.loss.backward();
  EXPECT_TRUE(at::allclose(x0.grad(), (dm.grad / 6).to(at::kFloat)));
}

TEST(Dmd2Test, RefusesWhatItCannotUse) {
  EXPECT_THAT(
      DistributionMatchingLoss(at::zeros({2, 3}), at::zeros({2, 3}), at::zeros({3, 3})).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fake_x0 [3, 3]")));
  EXPECT_THAT(DenoisingSteps(1000, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("steps (0)")));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<int64_t> steps, DenoisingSteps(1000, 4));
  EXPECT_EQ(steps, (std::vector<int64_t>{999, 749, 499, 249}));
}

TEST(AdvantagesTest, RefusesRewardsWithoutOneKeyPerRow) {
  DRAY_ASSERT_OK_AND_ASSIGN(AdvantageEstimator grpo, FindAdvantageEstimator("grpo"));
  EXPECT_THAT(grpo({"a", "b"}, at::zeros({3}), {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one group key per row")));
  // DanceGRPO's unbiased std has no value for a group of one.
  DRAY_ASSERT_OK_AND_ASSIGN(AdvantageEstimator dance, FindAdvantageEstimator("dance_grpo"));
  EXPECT_THAT(dance({"a", "a", "b"}, at::zeros({3}), {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("group 'b' has one sample")));
}

TEST(PolicyLossTest, KlNeedsTheReferenceMean) {
  DRAY_ASSERT_OK_AND_ASSIGN(PolicyLoss grpo, FindPolicyLoss("grpo"));
  PolicyLossInput input{at::zeros({2}), at::zeros({2}), at::zeros({2})};
  PolicyLossOptions options;
  options.beta = 0.04;
  EXPECT_THAT(grpo(input, options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("prev_sample_mean_ref")));
}

}  // namespace
}  // namespace dray::rl
