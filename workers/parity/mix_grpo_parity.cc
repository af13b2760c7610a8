#include "workers/parity/mix_grpo_parity.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "workers/parity/rl_case.h"
#include "workers/rl/advantages.h"
#include "workers/rl/mix_grpo_window.h"
#include "workers/rl/policy_loss.h"
#include "workers/rl/sde_sampler.h"
#include "workers/rl/sde_step.h"

namespace dray::rl {
namespace {

using nlohmann::json;

// Schedule: cases.json's schedule `name` (MixGRPO's sigmas in the case's
// dtype), with the transformer's timesteps as DanceGRPO and MixGRPO take
// them, int(sigma 1000).
SdeSchedule Schedule(const RlCase& data, const std::string& name) {
  const bool f64 = absl::EndsWith(name, "_f64");
  const at::Tensor sigmas =
      at::tensor(data.all.at("schedules").at(name).get<std::vector<double>>(), at::kDouble)
          .to(f64 ? at::kDouble : at::kFloat);
  const at::Tensor timesteps =
      at::trunc(sigmas.narrow(0, 0, sigmas.size(0) - 1).to(at::kFloat) * 1000);
  return {sigmas, timesteps};
}

at::Tensor Timestep(const SdeSchedule& schedule, int64_t index, int64_t batch) {
  return schedule.timesteps[index].expand({batch}).contiguous();
}

// RunStates: the window of each training step, as MixGRPO's state gives it
// before get_current_timesteps().
absl::StatusOr<std::vector<ParityResult>> RunStates(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  MixGrpoWindowOptions options;
  options.strategy = data.Param("sample_strategy").get<std::string>();
  options.size = data.Param("group_size").get<int64_t>();
  options.max_timesteps = data.Param("max_timesteps").get<int64_t>();
  options.iters_per_group = data.Param("iters_per_group").get<int64_t>();
  options.prog_overlap = data.Param("prog_overlap").get<bool>();
  options.prog_overlap_step = data.Param("prog_overlap_step").get<int64_t>();
  options.roll_back = data.Param("roll_back").get<bool>();
  options.max_iters_per_group = data.Param("max_iters_per_group").get<int64_t>();
  options.min_iters_per_group = data.Param("min_iters_per_group").get<int64_t>();
  const int64_t iterations = data.Param("iterations").get<int64_t>();
  at::Tensor start = at::empty({iterations}, at::kLong), length = at::empty_like(start);
  at::Tensor iter = at::empty_like(start), trained = at::full({iterations, options.size}, -1L);
  for (int64_t it = 0; it < iterations; ++it) {
    const MixGrpoWindow window = MixGrpoWindowAt(options, it);
    start[it] = window.begin;
    length[it] = window.end - window.begin;
    iter[it] = window.iter_in_group;
    for (int64_t k = window.begin; k < window.end; ++k) trained[it][k - window.begin] = k;
  }
  std::vector<ParityResult> results;
  CheckAll(c, data, data.spec.at("outputs"),
           {{"window_start", start},
            {"timesteps_train", trained},
            {"window_len", length},
            {"cur_iter_in_group", iter}},
           "", results);
  return results;
}

// RunStep: MixGRPO's flow_grpo_step as dray's "sde" step. Its deterministic
// steps are dray's Euler step (noise level 0); upstream then scores that
// point under the SDE's Gaussian, which dray's step computes given it.
absl::StatusOr<std::vector<ParityResult>> RunStep(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const SdeSchedule schedule = Schedule(data, data.spec.at("schedule").get<std::string>());
  const at::Tensor latents = data.Input("latents");
  SdeStepInput input{data.Input("model_output"),
                     Timestep(schedule, data.Param("index").get<int64_t>(), latents.size(0)),
                     latents, data.Param("eta").get<double>(), SdeType::kSde};
  const std::string path = data.spec.at("path").get<std::string>();
  std::vector<ParityResult> results;
  at::Tensor euler;
  if (path == "recompute") {
    input.prev_sample = data.Input("prev_sample");
    input.model_output.requires_grad_(true);
  } else {
    input.noise = data.Input("variance_noise");
    at::Generator generator =
        at::make_generator<at::CPUGeneratorImpl>(data.Param("generator_seed").get<uint64_t>());
    CheckDraw(c, data, "variance_noise", data.spec.at("inputs").at("variance_noise"),
              at::randn(latents.sizes(), generator, at::kFloat).to(latents.scalar_type()), results);
  }
  if (path == "rollout_determistic") {
    SdeStepInput ode = input;
    ode.noise_level = 0;
    DRAY_ASSIGN_OR_RETURN(SdeStepResult step, SdeStep(schedule, ode));
    euler = step.prev_sample;
    input.prev_sample = euler;
  }
  DRAY_ASSIGN_OR_RETURN(SdeStepResult step, SdeStep(schedule, input));
  Outputs computed = {
      {"prev_sample", euler.defined() ? euler : step.prev_sample},
      {"log_prob", step.log_prob},
      {"prev_sample_mean", step.prev_sample_mean},
      {"std", (step.std_dev_t * step.sqrt_neg_dt).view(-1).narrow(0, 0, 1)}};  // one per batch
  if (path == "recompute") {
    (data.Input("grad_log_prob").to(step.log_prob.scalar_type()) * step.log_prob).sum().backward();
    computed["grad_model_output"] = input.model_output.grad();
  }
  json outputs = data.spec.at("outputs");
  outputs.erase("pred_original_sample");  // a value of the step's arithmetic dray does not return
  CheckAll(c, data, outputs, computed, "", results);
  CheckAll(c, data, data.spec.value("gradients", json::object()), computed, "", results);
  return results;
}

// RunDanceStep: MixGRPO's copy of DanceGRPO's step as dray's "dance" step.
// A stray line break in the copy drops the Gaussian's -log(std) -
// log(sqrt(2 pi)) from its log-probability: they are added back to dray's.
absl::StatusOr<std::vector<ParityResult>> RunDanceStep(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const SdeSchedule schedule = Schedule(data, "flux_s25_shift3_f64");
  const at::Tensor latents = data.Input("latents");
  const bool sde = data.Param("sde_solver").get<bool>();
  SdeStepInput input{data.Input("model_output"),
                     Timestep(schedule, data.Param("index").get<int64_t>(), latents.size(0)),
                     latents, sde ? data.Param("eta").get<double>() : 0.0, SdeType::kDance};
  input.noise = sde ? data.Input("variance_noise") : at::zeros_like(latents);
  DRAY_ASSIGN_OR_RETURN(SdeStepResult step, SdeStep(schedule, input));
  Outputs computed = {{"prev_sample", step.prev_sample}};
  json outputs = data.spec.at("outputs");
  outputs.erase("pred_original_sample");
  if (sde) {
    const at::Tensor scale = (step.std_dev_t * step.sqrt_neg_dt).view(-1).to(at::kFloat);
    computed["log_prob"] = step.log_prob + at::log(scale) + 0.5 * std::log(2 * M_PI);
  } else {
    outputs.erase("log_prob");  // an ODE step has no log-probability (upstream returns 0)
  }
  std::vector<ParityResult> results;
  CheckAll(c, data, outputs, computed, "", results);
  return results;
}

// RunRollout: MixGRPO's rollout with its window (the other steps Euler, one
// noise draw per step either way) through dray's sampler around the
// reference's toy transformer, out = table[k] + 0.5 latents.
absl::StatusOr<std::vector<ParityResult>> RunRollout(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const SdeSchedule schedule = Schedule(data, "flux_s25_shift3_f32");
  const int64_t steps = schedule.timesteps.size(0);
  const int64_t begin = data.Param("window_start").get<int64_t>();
  const int64_t end = begin + static_cast<int64_t>(data.Param("timesteps_train").size());
  const at::Tensor table = data.Input("toy_table");
  const at::Tensor noise = data.Input("variance_noise");
  std::vector<at::Tensor> latents_seen;
  const PredictVelocity toy = [&](const at::Tensor& latents,
                                  const at::Tensor& timestep) -> absl::StatusOr<at::Tensor> {
    DRAY_ASSIGN_OR_RETURN(int64_t k, StepIndex(schedule.timesteps, timestep[0].item<float>()));
    latents_seen.push_back(latents);
    return table[k] + 0.5 * latents;
  };
  const SdeSamplerOptions options{data.Param("eta").get<double>(),
                                  SdeType::kSde,
                                  {static_cast<int>(begin), static_cast<int>(end)}};
  DRAY_ASSIGN_OR_RETURN(Trajectory trajectory,
                        SampleTrajectory(
                            schedule, data.Input("initial_latents"), toy,
                            [&](int step) { return noise[step].unsqueeze(0); }, options));
  latents_seen.push_back(trajectory.final_latents);
  const int64_t padded =  // the reference pads the trained steps with -1 to the window's size
      data.Get(data.spec.at("outputs").at("timesteps_train")).size(0);
  const at::Tensor trained =
      at::cat({at::arange(begin, end, at::kLong), at::full({padded - (end - begin)}, -1L)});
  const at::Tensor stochastic =
      at::arange(steps, at::kLong).ge(begin).logical_and(at::arange(steps, at::kLong).lt(end));
  Outputs computed = {{"determistic", stochastic.logical_not().to(at::kLong)},
                      {"timesteps_train", trained},
                      {"all_latents", at::stack(latents_seen, 1)},
                      {"final_latents", trajectory.final_latents}};
  json outputs = data.spec.at("outputs");
  outputs.erase("all_log_probs");  // the window's only: upstream's others score Euler points
  std::vector<ParityResult> results;
  CheckAll(c, data, outputs, computed, "", results);
  CheckValue(c, data, "all_log_probs[window]",
             data.Get(data.spec.at("outputs").at("all_log_probs")).narrow(1, begin, end - begin),
             trajectory.log_probs, results);
  return results;
}

// RunLoss: MixGRPO's training step of one window step j, one sample at a
// time as its script runs them: the recomputed step (latents as float32,
// as grpo_one_step casts them), the clipped surrogate and its
// log-probability penalty, divided by grad_accum x the window's length.
//
// MixGRPO's float64 cases still round one product to float32: the float32
// latents times its 0-dim float64 sigma factor stay float32 in torch, where
// dray's per-sample sigmas make it float64. They are compared within that
// rounding (2^-24 of x's term, measured up to 4.4e-8 in the log-probability
// and 7.9e-9 in the gradient) instead of their 1e-12.
absl::StatusOr<std::vector<ParityResult>> RunLoss(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const bool f64 = data.spec.at("dtype") == "f64";
  if (f64) data.spec["tolerance"] = {{"default", {{"atol", 1e-7}, {"rtol", 1e-6}}}};
  const SdeSchedule schedule =
      Schedule(data, data.Param("schedule").get<std::string>() + (f64 ? "_f64" : "_f32"));
  const int64_t j = data.Param("j").get<int64_t>();
  const PolicyLossOptions options{
      data.Param("clip_range").get<double>(), data.Param("adv_clip_max").get<double>(), 0.0,
      data.Param("divisor").get<int64_t>(), data.Param("kl_coeff").get<double>()};
  DRAY_ASSIGN_OR_RETURN(PolicyLoss loss, FindPolicyLoss("grpo"));
  const at::Tensor output = data.Input("transformer_output").requires_grad_(true);
  const at::Tensor latents = data.Input("latents_j").to(at::kFloat);
  const at::Tensor next_latents = data.Input("next_latents_j").to(at::kFloat);
  const at::Tensor old_log_probs = data.Input("old_log_probs").select(1, j);
  const at::Tensor advantages = data.Input("advantages_in");
  std::map<std::string, std::vector<at::Tensor>> per_sample;
  for (int64_t b = 0; b < output.size(0); ++b) {
    SdeStepInput input{output.narrow(0, b, 1), Timestep(schedule, j, 1), latents.narrow(0, b, 1),
                       data.Param("eta").get<double>(), SdeType::kSde};
    input.prev_sample = next_latents.narrow(0, b, 1);
    DRAY_ASSIGN_OR_RETURN(SdeStepResult step, SdeStep(schedule, input));
    step.log_prob.retain_grad();
    DRAY_ASSIGN_OR_RETURN(PolicyLossOutput out,
                          loss({advantages.narrow(0, b, 1), step.log_prob,
                                old_log_probs.narrow(0, b, 1).to(step.log_prob.scalar_type())},
                               options));
    out.loss.backward();
    for (const auto& [name, value] : Outputs{{"new_log_probs", step.log_prob},
                                             {"advantages", out.advantages},
                                             {"ratio", out.ratio},
                                             {"unclipped_loss", out.unclipped_loss},
                                             {"clipped_loss", out.clipped_loss},
                                             {"clip_frac", out.clipfrac},
                                             {"policy_loss", out.policy_loss},
                                             {"kl_loss", out.log_prob_kl_loss},
                                             {"loss", out.loss},
                                             {"grad_new_log_probs", step.log_prob.grad()}})
      per_sample[name].push_back(value.detach().reshape({1}));
  }
  Outputs computed = {{"grad_transformer_output", output.grad()}};
  for (const auto& [name, values] : per_sample) computed[name] = at::cat(values);
  std::vector<ParityResult> results;
  CheckAll(c, data, data.spec.at("outputs"), computed, "", results);
  CheckAll(c, data, data.spec.at("gradients"), computed, "", results);
  return results;
}

// RunAdvantages: MixGRPO's use_group advantages, trimmed or not: of the
// summed reward ("reward_aggr"), or each reward's weighted and summed
// ("advantage_aggr", MixedAdvantages).
absl::StatusOr<std::vector<ParityResult>> RunAdvantages(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const bool mixed = data.Param("multi_reward_mix") == "advantage_aggr";
  std::vector<at::Tensor> columns;
  std::vector<double> weights;
  if (mixed) {
    for (const auto& [name, weight] : data.Param("reward_weights").items()) {
      columns.push_back(data.Input("rewards." + name));
      weights.push_back(weight.get<double>());
    }
  } else {
    columns.push_back(data.Input("rewards"));
    weights.push_back(1.0);
  }
  const int64_t generations = data.Param("num_generations").get<int64_t>();
  std::vector<std::string> groups;
  for (int64_t i = 0; i < columns[0].size(0); ++i)
    groups.push_back(std::to_string(i / generations));
  DRAY_ASSIGN_OR_RETURN(AdvantageEstimator estimate, FindAdvantageEstimator("dance_grpo"));
  AdvantageOptions options;
  options.trimmed_ratio = data.Param("trimmed_ratio").get<double>();
  DRAY_ASSIGN_OR_RETURN(at::Tensor advantages,
                        MixedAdvantages(estimate, groups, at::stack(columns, 1), weights, options));
  std::vector<ParityResult> results;
  CheckAll(c, data, data.spec.at("outputs"), {{"advantages", advantages}}, "", results);
  return results;
}

}  // namespace

std::vector<ParityCase> MixGrpoParityCases(const std::string& folder) {
  std::vector<ParityCase> cases = RlCasesIn(folder, "/MixGRPO",
                                            {{"states", RunStates},
                                             {"flow_grpo_step", RunStep},
                                             {"dance_grpo_step", RunDanceStep},
                                             {"rollout", RunRollout},
                                             {"loss", RunLoss},
                                             {"adv", RunAdvantages}});
  // The bfloat16 steps and numpy's random windows are left out (see the header).
  cases.erase(std::remove_if(cases.begin(), cases.end(),
                             [](const ParityCase& c) {
                               return absl::EndsWith(c.name, "_bf16_model_output") ||
                                      c.name == "states.random_seeded";
                             }),
              cases.end());
  return cases;
}

}  // namespace dray::rl
