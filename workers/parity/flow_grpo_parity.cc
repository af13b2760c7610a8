#include "workers/parity/flow_grpo_parity.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "workers/models/qwen_image/edit_pipeline.h"
#include "workers/parity/rl_case.h"
#include "workers/rl/advantages.h"
#include "workers/rl/nft_loss.h"
#include "workers/rl/ode_sampler.h"
#include "workers/rl/policy_loss.h"
#include "workers/rl/sde_sampler.h"
#include "workers/rl/sde_step.h"

namespace dray::rl {
namespace {

using nlohmann::json;

at::Tensor Randn(at::IntArrayRef shape, at::Generator& generator) {
  return at::randn(shape, generator, at::kFloat);
}

// CaseSchedule: the case's schedule, its sigmas float32 values (held in
// float64 by a float64 case).
SdeSchedule CaseSchedule(const RlCase& data) {
  const bool f64 = data.spec.at("dtype") == "f64";
  const json& schedule_json =
      data.all.at("schedules").at(data.spec.at("schedule").get<std::string>());
  return {at::tensor(schedule_json.at("sigmas").get<std::vector<double>>(), at::kDouble)
              .to(at::kFloat)
              .to(f64 ? at::kDouble : at::kFloat),
          at::tensor(schedule_json.at("timesteps").get<std::vector<double>>(), at::kDouble)
              .to(at::kFloat)};
}

absl::StatusOr<std::vector<ParityResult>> RunSdeStep(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const SdeSchedule schedule = CaseSchedule(data);
  DRAY_ASSIGN_OR_RETURN(SdeType type, ParseSdeType(data.Param("sde_type").get<std::string>()));
  SdeStepInput input{data.Input("model_output"), data.Input("timestep"), data.Input("sample"),
                     data.Param("noise_level").get<double>(), type};
  const bool recompute = data.spec.at("path") == "recompute";
  Outputs computed;
  std::vector<ParityResult> results;
  if (recompute) {
    input.prev_sample = data.Input("prev_sample");
    input.model_output.requires_grad_(true);
  } else {
    const json& noise = data.spec.at("outputs").at("variance_noise");
    input.noise = data.Get(noise);
    at::Generator generator =
        at::make_generator<at::CPUGeneratorImpl>(data.Param("generator_seed").get<uint64_t>());
    CheckDraw(c, data, "variance_noise", noise, Randn(input.sample.sizes(), generator), results);
  }
  DRAY_ASSIGN_OR_RETURN(SdeStepResult step, SdeStep(schedule, input));
  computed[recompute ? "returned_prev_sample" : "prev_sample"] = step.prev_sample;
  computed["log_prob"] = step.log_prob;
  computed["prev_sample_mean"] = step.prev_sample_mean;
  computed["std_dev_t"] = step.std_dev_t;
  computed["sqrt_neg_dt"] = step.sqrt_neg_dt;
  if (recompute) {
    (data.Input("grad_log_prob") * step.log_prob).sum().backward();
    computed["grad_model_output"] = input.model_output.grad();
  }
  json outputs = data.spec.at("outputs");
  outputs.erase("old_log_prob");    // the behaviour step's, an input of training
  outputs.erase("variance_noise");  // checked as drawn
  CheckAll(c, data, outputs, computed, "", results);
  return results;
}

absl::StatusOr<std::vector<ParityResult>> RunAdvantages(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const at::Tensor rewards = data.Input("rewards");
  const bool per_prompt = data.spec.at("params").contains("prompts");
  const std::vector<std::string> groups =
      per_prompt ? data.Param("prompts").get<std::vector<std::string>>()
                 : std::vector<std::string>(rewards.size(0));
  DRAY_ASSIGN_OR_RETURN(AdvantageEstimator estimate,
                        FindAdvantageEstimator(per_prompt ? "grpo" : "global"));
  AdvantageOptions options;
  if (per_prompt) options.global_std = data.Param("global_std").get<bool>();
  DRAY_ASSIGN_OR_RETURN(at::Tensor advantages, estimate(groups, rewards, options));
  std::vector<ParityResult> results;
  CheckAll(c, data, data.spec.at("outputs"), {{"advantages", advantages}}, "", results);
  return results;
}

// LossOutputs names a loss's results as the reference does.
Outputs LossOutputs(const PolicyLossOutput& out) {
  return {{"advantages", out.advantages},
          {"ratio", out.ratio},
          {"unclipped_loss", out.unclipped_loss},
          {"clipped_loss", out.clipped_loss},
          {"policy_loss", out.policy_loss},
          {"kl_loss", out.kl_loss},
          {"loss", out.loss},
          {"info.approx_kl", out.approx_kl},
          {"info.clipfrac", out.clipfrac},
          {"info.clipfrac_gt_one", out.clipfrac_gt_one},
          {"info.clipfrac_lt_one", out.clipfrac_lt_one}};
}

PolicyLossOptions LossOptions(const json& params, int64_t accumulation_steps) {
  return {params.at("clip_range").get<double>(), params.at("adv_clip_max").get<double>(),
          params.at("beta").get<double>(), accumulation_steps};
}

absl::StatusOr<std::vector<ParityResult>> RunLoss(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const int64_t j = data.Param("j").get<int64_t>();
  PolicyLossInput input{data.Input("advantages_all").select(1, j),
                        data.Input("log_prob").requires_grad_(true),
                        data.Input("old_log_probs_all").select(1, j),
                        data.Input("prev_sample_mean").requires_grad_(true),
                        data.Input("prev_sample_mean_ref"),
                        data.Input("std_dev_t")};
  DRAY_ASSIGN_OR_RETURN(PolicyLoss loss, FindPolicyLoss("grpo"));
  DRAY_ASSIGN_OR_RETURN(
      PolicyLossOutput out,
      loss(input, LossOptions(data.spec.at("params"),
                              data.Param("gradient_accumulation_steps").get<int64_t>())));
  out.loss.backward();
  Outputs computed = LossOutputs(out);
  std::vector<ParityResult> results;
  CheckAll(c, data, data.spec.at("outputs"), computed, "", results);
  CheckPart(c, data, "info", computed, results);
  CheckAll(c, data, data.spec.at("gradients"),
           {{"grad_log_prob", input.log_prob.grad()},
            {"grad_prev_sample_mean", input.prev_sample_mean.grad()}},
           "", results);
  return results;
}

// GuardStep: flow_grpo's GRPO-Guard compute_log_prob on a stand-in
// transformer's output (cfg: [uncond; text] rows, guided as upstream), the
// velocity rounded to float32 as its `.float()` does.
absl::StatusOr<SdeStepResult> GuardStep(const RlCase& data, const at::Tensor& output) {
  at::Tensor velocity = output;
  if (data.Param("train.cfg").get<bool>()) {
    const std::vector<at::Tensor> halves = output.chunk(2);
    velocity = halves[0] + data.Param("guidance_scale").get<double>() * (halves[1] - halves[0]);
  }
  SdeStepInput input{velocity.to(at::kFloat), data.Input("timestep_j"),
                     data.Input("latents_j").to(at::kFloat),
                     data.Param("noise_level").get<double>(), SdeType::kSde};
  input.prev_sample = data.Input("next_latents_j").to(at::kFloat);
  return SdeStep(CaseSchedule(data), input);
}

// RunGuard: GRPO-Guard's recomputed step and loss (tests/data/reference/grpo_guard).
// The reference's loss is not divided by accelerate's G, its backward is:
// dray's loss is run with G and its values multiplied back.
absl::StatusOr<std::vector<ParityResult>> RunGuard(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const int64_t j = data.Param("j").get<int64_t>();
  const at::Tensor output = data.Input("transformer_output").requires_grad_(true);
  DRAY_ASSIGN_OR_RETURN(SdeStepResult step, GuardStep(data, output));
  step.log_prob.retain_grad();
  step.prev_sample_mean.retain_grad();
  const json& params = data.spec.at("params");
  PolicyLossInput input{data.Input("advantages_all").select(1, j),
                        step.log_prob,
                        data.Input("old_log_probs_all").select(1, j),
                        step.prev_sample_mean,
                        at::Tensor(),
                        step.std_dev_t,
                        data.Input("old_prev_sample_mean_j"),
                        step.sqrt_neg_dt};
  const double beta = params.at("train.beta").get<double>();
  if (beta > 0) {
    at::NoGradGuard no_grad;
    DRAY_ASSIGN_OR_RETURN(SdeStepResult ref, GuardStep(data, data.Input("transformer_output_ref")));
    input.prev_sample_mean_ref = ref.prev_sample_mean;
  }
  const int64_t g = params.at("accelerate_gradient_accumulation_steps").get<int64_t>();
  DRAY_ASSIGN_OR_RETURN(PolicyLoss loss, FindPolicyLoss("grpo_guard"));
  DRAY_ASSIGN_OR_RETURN(PolicyLossOutput out,
                        loss(input, {params.at("clip_range").get<double>(),
                                     params.at("adv_clip_max").get<double>(), beta, g}));
  out.loss.backward();
  for (at::Tensor* divided : {&out.policy_loss, &out.kl_loss, &out.loss}) {
    if (divided->defined()) *divided = *divided * static_cast<double>(g);
  }
  Outputs computed = LossOutputs(out);
  computed.insert({{"prev_sample", step.prev_sample},
                   {"log_prob", step.log_prob},
                   {"prev_sample_mean", step.prev_sample_mean},
                   {"std_dev_t", step.std_dev_t},
                   {"sqrt_dt", step.sqrt_neg_dt},
                   {"sigma_t", step.std_dev_t.mean()},
                   {"ratio_mean_bias", out.ratio_bias},
                   {"prev_sample_mean_ref", input.prev_sample_mean_ref},
                   {"info.policy_loss", out.policy_loss},
                   {"info.kl_loss", out.kl_loss},
                   {"info.loss", out.loss}});
  std::vector<ParityResult> results;
  CheckAll(c, data, data.spec.at("outputs"), computed, "", results);
  CheckPart(c, data, "info", computed, results);
  CheckAll(c, data, data.spec.at("gradients"),
           {{"grad_transformer_output", output.grad()},
            {"grad_log_prob", step.log_prob.grad()},
            {"grad_prev_sample_mean", step.prev_sample_mean.grad()}},
           "", results);
  return results;
}

// The DanceGRPO cases (tests/data/reference/dance_grpo): its schedule, its
// flux_step as SdeType::kDance and its group advantages.

absl::StatusOr<std::vector<ParityResult>> RunDanceSchedule(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const SdeSchedule schedule = DanceGrpoSchedule(
      data.Param("sampling_steps").get<int64_t>(), data.Param("shift").get<double>(),
      data.spec.at("dtype") == "f64" ? at::kDouble : at::kFloat);
  std::vector<ParityResult> results;
  CheckAll(c, data, data.spec.at("outputs"),
           {{"sigma_schedule", schedule.sigmas}, {"timestep_value", schedule.timesteps}}, "",
           results);
  return results;
}

absl::StatusOr<std::vector<ParityResult>> RunFluxStep(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const bool bf16 = data.spec.at("dtype") == "bf16+f32";
  // The schedule the case names, as DanceGRPO made it (the bf16 cases': float32's).
  const std::string schedule_case =
      data.spec.at("params").value("schedule", "schedule.s20_shift3_f32");
  const SdeSchedule schedule{data.Get(schedule_case + ".sigma_schedule"),
                             data.Get(schedule_case + ".timestep_value").to(at::kFloat)};
  const at::Tensor model_output =
      bf16 ? data.Input("model_output_bf16_values").to(at::kBFloat16) : data.Input("model_output");
  const at::Tensor latents = data.Input("latents");
  const int64_t index = data.Param("index").get<int64_t>();
  SdeStepInput input{model_output, schedule.timesteps[index].expand({latents.size(0)}).contiguous(),
                     latents, data.Param("eta").get<double>(), SdeType::kDance};
  const bool recompute = data.spec.at("path") == "recompute";
  if (recompute) {
    input.prev_sample = data.Input("prev_sample");
    input.model_output.requires_grad_(true);
  } else {
    input.noise = data.Input("variance_noise");
  }
  DRAY_ASSIGN_OR_RETURN(SdeStepResult step, SdeStep(schedule, input));
  Outputs computed = {{"prev_sample", step.prev_sample},
                      {"log_prob", step.log_prob},
                      {"prev_sample_mean", step.prev_sample_mean}};
  json outputs = data.spec.at("outputs");
  outputs.erase("pred_original_sample");  // a value of the step's arithmetic dray does not return
  outputs.erase("old_log_prob");          // the behaviour step's, an input of training
  std::vector<ParityResult> results;
  CheckAll(c, data, outputs, computed, "", results);
  if (recompute && data.spec.value("gradients", json::object()).contains("grad_model_output")) {
    (data.Input("grad_log_prob") * step.log_prob).sum().backward();
    CheckAll(c, data, data.spec.at("gradients"), {{"grad_model_output", input.model_output.grad()}},
             "", results);
  }
  return results;
}

// RunDanceAdvantages: use_group per consecutive group of num_generations;
// otherwise this rank's rows (the first of the gathered rewards) against
// all of them, as one group.
absl::StatusOr<std::vector<ParityResult>> RunDanceAdvantages(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const bool use_group = data.Param("use_group").get<bool>();
  const at::Tensor rewards = use_group ? data.Input("rewards") : data.Input("gathered_reward");
  const int64_t generations = data.Param("num_generations").get<int64_t>();
  std::vector<std::string> groups;
  for (int64_t i = 0; i < rewards.size(0); ++i)
    groups.push_back(use_group ? std::to_string(i / generations) : "all");
  DRAY_ASSIGN_OR_RETURN(AdvantageEstimator estimate, FindAdvantageEstimator("dance_grpo"));
  DRAY_ASSIGN_OR_RETURN(at::Tensor advantages, estimate(groups, rewards, {}));
  std::vector<ParityResult> results;
  CheckAll(c, data, data.spec.at("outputs"),
           {{"advantages", advantages.narrow(0, 0, data.Input("rewards").size(0))}}, "", results);
  return results;
}

// RowToy: the DanceGRPO chain's stand-in transformer, without guidance:
// out[b] = table[k_b] + 0.5 hidden[b] over [latents, image latents], k_b
// the schedule index of row b's timestep; it keeps its last output (a leaf,
// for the gradient) and the timesteps it saw.
struct RowToy {
  at::Tensor table;
  at::Tensor scaled_timesteps;  // the schedule's timesteps / 1000, as the pipeline scales them
  at::Tensor output, seen_timestep;

  absl::StatusOr<at::Tensor> operator()(const at::Tensor& hidden, const at::Tensor& timestep) {
    std::vector<at::Tensor> rows;
    for (int64_t b = 0; b < hidden.size(0); ++b) {
      DRAY_ASSIGN_OR_RETURN(int64_t k, StepIndex(scaled_timesteps, timestep[b].item<float>()));
      rows.push_back(table[k] + 0.5 * hidden[b]);
    }
    output = at::stack(rows).detach().requires_grad_(true);
    seen_timestep = timestep.detach();
    return output;
  }
};

// RunDanceChain: DanceGRPO's rollout and training step end to end, through
// dray's Qwen-Image-Edit pipeline (latents and image latents joined, no
// guidance) around the reference's toy: the group's shared initial noise,
// every step stochastic, then each sample's own trained steps (the
// reference's perms), each (sample, step)'s log-probability, clipped loss
// and gradient. The harness's own sums (total_loss) and its toy table's
// clipped gradient are the reference optimizer's, not compared.
absl::StatusOr<std::vector<ParityResult>> RunDanceChain(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const json& params = data.spec.at("params");
  const int64_t steps = params.at("sampling_steps").get<int64_t>();
  const int64_t generations = params.at("num_generations").get<int64_t>();
  const int64_t trained = params.at("train_timesteps").get<int64_t>();
  const SdeSchedule schedule = DanceGrpoSchedule(steps, params.at("shift").get<double>());
  std::vector<ParityResult> results;
  CheckValue(c, data, "sigma_schedule", data.Input("sigma_schedule"), schedule.sigmas, results);

  qwen_image::QwenImageEditPipeline pipeline((qwen_image::QwenImageModel()));
  qwen_image::PreparedEdit prepared;
  prepared.image_latents = data.Input("image_latents").repeat_interleave(generations, 0);
  const int64_t batch = prepared.image_latents.size(0);
  prepared.prompt = {at::zeros({batch, 1, 1}), at::ones({batch, 1}, at::kLong)};
  auto predictor = [&](RowToy& toy) -> PredictVelocity {
    const qwen_image::Denoiser denoiser =
        [&toy](const at::Tensor& hidden, const qwen_image::PromptEmbeddings&,
               const at::Tensor& timestep,
               const std::vector<qwen_image::SampleImages>&) { return toy(hidden, timestep); };
    return [&, denoiser](const at::Tensor& latents, const at::Tensor& timestep) {
      return pipeline.Velocity(prepared, latents, timestep, 1.0, denoiser);
    };
  };
  const SdeSamplerOptions options{
      params.at("eta").get<double>(), SdeType::kDance, {0, static_cast<int>(steps)}};
  RowToy behaviour{data.Input("behaviour_table"), schedule.timesteps / 1000};
  const at::Tensor noise = data.Input("rollout.variance_noise");
  DRAY_ASSIGN_OR_RETURN(
      Trajectory trajectory,
      SampleTrajectory(
          schedule, data.Input("init_noise").expand({batch, -1, -1}).contiguous(),
          predictor(behaviour), [&](int step) { return noise.select(1, step); }, options));
  const at::Tensor rewards = data.Input("rewards");
  std::vector<std::string> groups;
  for (int64_t i = 0; i < batch; ++i) groups.push_back(std::to_string(i / generations));
  DRAY_ASSIGN_OR_RETURN(AdvantageEstimator estimate, FindAdvantageEstimator("dance_grpo"));
  DRAY_ASSIGN_OR_RETURN(at::Tensor advantages, estimate(groups, rewards, {}));

  // Training: at pass k each row takes its own k-th step (perms[i][k]).
  DRAY_ASSIGN_OR_RETURN(PolicyLoss loss, FindPolicyLoss("grpo"));
  const PolicyLossOptions loss_options{params.at("clip_range").get<double>(),
                                       params.at("adv_clip_max").get<double>(), 0.0,
                                       params.at("loss_divisor").get<int64_t>()};
  RowToy policy{data.Input("policy_table"), schedule.timesteps / 1000};
  const at::Tensor perms = data.Input("perms");
  std::map<std::string, std::vector<at::Tensor>> per_step;
  for (int64_t k = 0; k < trained; ++k) {
    const at::Tensor j = perms.select(1, k);
    DRAY_ASSIGN_OR_RETURN(SdeStepResult step,
                          RecomputeStep(schedule, predictor(policy), trajectory, j, options));
    const at::Tensor old_log_prob = AtSteps(trajectory.log_probs, j);
    std::vector<at::Tensor> losses;
    std::map<std::string, std::vector<at::Tensor>> rows;
    for (int64_t b = 0; b < batch; ++b) {  // DanceGRPO's batch of one
      DRAY_ASSIGN_OR_RETURN(PolicyLossOutput out,
                            loss({advantages.narrow(0, b, 1), step.log_prob.narrow(0, b, 1),
                                  old_log_prob.narrow(0, b, 1)},
                                 loss_options));
      losses.push_back(out.loss);
      for (const auto& [name, value] : Outputs{{"advantages", out.advantages},
                                               {"ratio", out.ratio},
                                               {"unclipped_loss", out.unclipped_loss},
                                               {"clipped_loss", out.clipped_loss},
                                               {"loss", out.loss.reshape({1})}})
        rows[name].push_back(value.detach());
    }
    at::stack(losses).sum().backward();  // each row's loss reaches its own row only
    rows["new_log_probs"].push_back(step.log_prob.detach().unsqueeze(1));
    for (auto& [name, values] : rows) per_step[name].push_back(at::cat(values).view({batch, 1}));
    per_step["transformer_output"].push_back(policy.output.detach());
    per_step["grad_transformer_output"].push_back(policy.output.grad());
    per_step["transformer_timestep"].push_back(policy.seen_timestep);
  }
  Outputs computed = {{"rollout.all_latents",
                       at::cat({trajectory.latents.narrow(1, 0, 1), trajectory.next_latents}, 1)},
                      {"rollout.all_log_probs", trajectory.log_probs},
                      // The trained steps' values, in each sample's permuted order (DanceGRPO
                      // permutes its samples' trimmed steps in place).
                      {"samples.timesteps", trajectory.timesteps.gather(1, perms).to(at::kLong)},
                      {"samples.log_probs", trajectory.log_probs.gather(1, perms)},
                      {"samples.advantages", advantages}};
  for (const auto& [name, values] : per_step) computed["train." + name] = at::stack(values, 1);
  json outputs = data.spec.at("outputs");
  for (const char* harness : {"total_loss", "grad_norm", "train.sigma_index"})
    outputs.erase(harness);  // the harness's sums and optimizer, and the perms it was given
  CheckAll(c, data, outputs, computed, "", results);
  json gradients = data.spec.at("gradients");
  gradients.erase("train.policy_table_grad_after_clip");
  CheckAll(c, data, gradients, computed, "", results);
  return results;
}

// The DiffusionNFT cases (tests/data/reference/diffusion_nft): its loss
// with every intermediate value and the gradient, the decay schedule and
// the sampling policy's update.

absl::StatusOr<std::vector<ParityResult>> RunNftLoss(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const int64_t j = data.Param("j_idx").get<int64_t>();
  const at::Tensor velocity = data.Input("forward_prediction").requires_grad_(true);
  NftLossInput input{data.Input("latents_clean"),
                     data.Input("noise"),
                     data.Input("timesteps_all").select(1, j) / 1000.0,
                     data.Input("advantages_all").select(1, j),
                     velocity,
                     data.Input("old_prediction"),
                     data.Input("ref_forward_prediction")};
  NftLossOptions options{data.Param("config.beta").get<double>(),
                         data.Param("config.train.beta").get<double>(),
                         data.Param("config.train.adv_clip_max").get<double>(),
                         data.Param("config.train.adv_mode").get<std::string>(),
                         data.Param("effective_grad_accum_steps").get<int64_t>()};
  DRAY_ASSIGN_OR_RETURN(NftLossOutput out, NftLoss(input, options));
  out.loss.backward();
  const Outputs computed = {
      {"xt", out.xt},
      {"advantages_clip", out.advantages},
      {"r", out.r},
      {"positive_prediction", out.positive_prediction},
      {"implicit_negative_prediction", out.negative_prediction},
      {"x0_prediction", out.x0_prediction},
      {"weight_factor", out.weight},
      {"positive_loss", out.positive_loss},
      {"negative_x0_prediction", out.negative_x0_prediction},
      {"negative_weight_factor", out.negative_weight},
      {"negative_loss", out.negative_loss},
      {"ori_policy_loss", out.per_sample_loss},
      {"policy_loss", out.total},  // upstream's `loss += ...` also changes policy_loss
      {"kl_div_loss", out.kl_loss},
      {"loss", out.total},
      {"scaled_loss", out.loss},
      {"info.policy_loss", out.total},
      {"info.unweighted_policy_loss", out.per_sample_loss.mean()},
      {"info.kl_div_loss", out.kl_loss},
      {"info.kl_div", out.kl_loss},
      {"info.total_loss", out.total},
      {"derived.policy_loss_at_assignment", out.policy_loss},
      {"grad_forward_prediction", velocity.grad()}};
  // Not values of NftLoss (checked once training computes and logs them):
  // the noise level t and its broadcast, the advantage's rescaling before
  // its clamp, and upstream's diagnostics of the batch.
  json outputs = data.spec.at("outputs");
  for (const char* input_side : {"t", "t_expanded", "normalized_advantages_clip"})
    outputs.erase(input_side);
  const std::set<std::string> diagnostics = {"x0_norm",     "x0_norm_max",
                                             "old_deviate", "old_deviate_max",
                                             "old_kl_div",  "kl_div_loss_per_sample"};
  std::vector<ParityResult> results;
  CheckAll(c, data, outputs, computed, "", results);
  for (const char* part : {"info", "derived"})
    CheckPart(c, data, part, computed, results, diagnostics);
  CheckAll(c, data, data.spec.at("gradients"), computed, "", results);
  return results;
}

absl::StatusOr<std::vector<ParityResult>> RunNftDecay(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const at::Tensor steps = data.Input("step");
  std::vector<double> decays;
  for (int64_t i = 0; i < steps.size(0); ++i) {
    DRAY_ASSIGN_OR_RETURN(double decay, NftOldPolicyDecay(steps[i].item<int64_t>(),
                                                          data.Param("decay_type").get<int>()));
    decays.push_back(decay);
  }
  std::vector<ParityResult> results;
  CheckAll(c, data, data.spec.at("outputs"), {{"decay", at::tensor(decays, at::kDouble)}}, "",
           results);
  return results;
}

// RunNftOldUpdate: NftBlendedPolicy, the decay from NftOldPolicyDecay.
absl::StatusOr<std::vector<ParityResult>> RunNftOldUpdate(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  DRAY_ASSIGN_OR_RETURN(double decay, NftOldPolicyDecay(data.Param("global_step").get<int64_t>(),
                                                        data.Param("decay_type").get<int>()));
  Outputs computed;
  for (const char* p : {"0", "1"}) {
    computed[absl::StrCat("new_old_param", p)] = NftBlendedPolicy(
        data.Input(absl::StrCat("old_param", p)), data.Input(absl::StrCat("param", p)), decay);
  }
  std::vector<ParityResult> results;
  CheckAll(c, data, data.spec.at("outputs"), computed, "", results);
  return results;
}

// RunNftSampling: DiffusionNFT's deterministic rollout (run_sampling with
// solver flow or dpm2) on its stand-in model, 0.5 tanh(z) + table[i] at
// step i, every step's latents compared.
absl::StatusOr<std::vector<ParityResult>> RunNftSampling(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  DRAY_ASSIGN_OR_RETURN(OdeSolver solver, ParseOdeSolver(data.Param("solver").get<std::string>()));
  const at::Tensor sigmas = data.Input("sigmas");
  const at::Tensor table = data.Input("table");
  const SdeSchedule schedule{sigmas, sigmas.narrow(0, 0, sigmas.size(0) - 1) * 1000};
  std::vector<at::Tensor> all = {data.Input("z")};
  int64_t step = 0;
  auto toy = [&](const at::Tensor& latents, const at::Tensor&) -> absl::StatusOr<at::Tensor> {
    all.push_back(latents);  // the step before's result: what this step is asked on
    return 0.5 * at::tanh(latents) + table[step++];
  };
  DRAY_ASSIGN_OR_RETURN(at::Tensor latents, SampleOde(schedule, data.Input("z"), toy, solver));
  all.erase(all.begin() + 1);  // the first call's latents are z itself
  all.push_back(latents);
  std::vector<ParityResult> results;
  CheckAll(c, data, data.spec.at("outputs"),
           {{"latents", latents}, {"all_latents", at::stack(all, 1)}}, "", results);
  return results;
}

// ToyTransformer is the reference rollouts' stand-in model: output =
// table[k] + 0.5 * hidden for the 2B rows (conditional, then negative) of
// [latents, image latents], k the timestep's schedule index. dray's
// Edit-Plus pipeline asks it for each side in turn (Velocity: the
// conditional side first, then the negative one): it answers the first
// from a fresh output (a leaf, for the gradient) and the second from the
// same output's other half. It ignores the text, as the reference's does.
struct ToyTransformer {
  at::Tensor table;
  at::Tensor scaled_timesteps;  // the schedule's timesteps / 1000, as the pipeline scales them
  at::Tensor output;
  bool negative_next = false;

  absl::StatusOr<at::Tensor> operator()(const at::Tensor& hidden, const at::Tensor& timestep) {
    const int64_t batch = hidden.size(0);
    if (negative_next) {
      negative_next = false;
      return output.narrow(0, batch, batch);
    }
    DRAY_ASSIGN_OR_RETURN(int64_t k, StepIndex(scaled_timesteps, timestep[0].item<float>()));
    output = (table[k] + 0.5 * at::cat({hidden, hidden}, 0)).detach().requires_grad_(true);
    negative_next = true;
    return output.narrow(0, 0, batch);
  }
};

// ToyEdit: the reference's rollout inputs as dray's prepared edit (its
// image latents; the text, which the toy ignores, as placeholders; a
// negative prompt, so that the pipeline guides).
qwen_image::PreparedEdit ToyEdit(const at::Tensor& image_latents) {
  qwen_image::PreparedEdit prepared;
  prepared.image_latents = image_latents;
  const int64_t batch = image_latents.size(0);
  prepared.prompt = {at::zeros({batch, 1, 1}), at::ones({batch, 1}, at::kLong)};
  prepared.negative = prepared.prompt;
  return prepared;
}

absl::StatusOr<std::vector<ParityResult>> RunRollout(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const json& params = data.spec.at("params");
  const json& tensors = data.spec.at("tensors");
  const json& inputs = tensors.at("inputs");
  const SdeSchedule schedule{data.Get(inputs.at("schedule_sigmas")),
                             data.Get(inputs.at("schedule_timesteps"))};
  // The velocities come from dray's Edit-Plus pipeline (the latents and the
  // pictures' latents joined, the timestep scaled, the output cut to the
  // latents' tokens, true CFG with its norm rescale) around the toy model.
  qwen_image::QwenImageModel model;
  model.pipeline = qwen_image::EditPipelineKind::kEditPlus;
  qwen_image::QwenImageEditPipeline pipeline(std::move(model));
  const qwen_image::PreparedEdit prepared = ToyEdit(data.Get(inputs.at("image_latents")));
  const double guidance_scale = params.at("guidance_scale").get<double>();
  auto toy = [&](const json& table) {
    return std::make_shared<ToyTransformer>(
        ToyTransformer{data.Get(table), schedule.timesteps / 1000});
  };
  auto predictor = [&](std::shared_ptr<ToyTransformer> transformer) -> PredictVelocity {
    const qwen_image::Denoiser denoiser =
        [transformer](const at::Tensor& hidden, const qwen_image::PromptEmbeddings&,
                      const at::Tensor& timestep, const std::vector<qwen_image::SampleImages>&) {
          return (*transformer)(hidden, timestep);
        };
    return [&, denoiser](const at::Tensor& latents, const at::Tensor& timestep) {
      return pipeline.Velocity(prepared, latents, timestep, guidance_scale, denoiser);
    };
  };
  std::vector<ParityResult> results;

  // Rollout: the reference's noise, and dray's draws from the same seed checked against it.
  const json& per_step = tensors.at("per_step");
  at::Generator generator =
      at::make_generator<at::CPUGeneratorImpl>(data.spec.at("global_rng_seed").get<uint64_t>());
  const PredictVelocity sample = predictor(toy(inputs.at("toy_table")));
  std::vector<at::Tensor> velocities;
  PredictVelocity predict = [&](const at::Tensor& latents, const at::Tensor& timestep) {
    absl::StatusOr<at::Tensor> velocity = sample(latents, timestep);
    if (velocity.ok()) velocities.push_back(velocity->detach());
    return velocity;
  };
  DrawNoise draw = [&](int step) {
    const json& names = per_step.at(std::to_string(step));
    const at::Tensor recorded = data.Get(names.at("variance_noise"));
    CheckDraw(c, data, absl::StrCat("step", step, ".variance_noise"), names.at("variance_noise"),
              Randn(recorded.sizes(), generator), results);
    return recorded;
  };
  const std::vector<int> window = data.spec.at("sde_window").get<std::vector<int>>();
  const SdeSamplerOptions options{
      params.at("noise_level").get<double>(), SdeType::kSde, {window.at(0), window.at(1)}};
  DRAY_ASSIGN_OR_RETURN(
      Trajectory trajectory,
      SampleTrajectory(schedule, data.Get(inputs.at("initial_latents")), predict, draw, options));
  for (size_t step = 0; step < velocities.size(); ++step) {
    const json& names = per_step.at(std::to_string(step));
    Check(c, data, absl::StrCat("step", step, ".noise_pred"), names.at("noise_pred"),
          velocities[step], results);
  }
  json outputs = tensors.at("outputs");
  for (const char* text : {"prompt_embeds", "prompt_embeds_mask", "negative_prompt_embeds",
                           "negative_prompt_embeds_mask"}) {
    outputs.erase(text);  // the toy model ignores text
  }
  CheckAll(
      c, data, outputs,
      {{"all_latents", at::cat({trajectory.latents.narrow(1, 0, 1), trajectory.next_latents}, 1)},
       {"all_timesteps", trajectory.timesteps.select(0, 0)},
       {"samples.latents", trajectory.latents},
       {"samples.next_latents", trajectory.next_latents},
       {"samples.log_probs", trajectory.log_probs},
       {"samples.timesteps", trajectory.timesteps},
       {"all_log_probs", trajectory.log_probs},
       {"final_latents", trajectory.final_latents}},
      "", results);

  // Training: advantages, then every window step's recomputed log-prob, loss and gradient.
  const json& train = tensors.at("train");
  DRAY_ASSIGN_OR_RETURN(AdvantageEstimator estimate, FindAdvantageEstimator("grpo"));
  DRAY_ASSIGN_OR_RETURN(
      at::Tensor advantages,
      estimate(params.at("prompts").get<std::vector<std::string>>(), data.Get(train.at("rewards")),
               {params.at("global_std").get<bool>()}));
  Check(c, data, "train.advantages", train.at("advantages"), advantages, results);
  DRAY_ASSIGN_OR_RETURN(PolicyLoss loss, FindPolicyLoss("grpo"));
  const PolicyLossOptions loss_options = LossOptions(
      params, data.spec.at("derived_shapes").at("gradient_accumulation_steps").get<int64_t>());
  auto policy = toy(train.at("policy_table"));
  auto reference = toy(train.at("ref_table"));
  for (const auto& [j_text, names] : train.at("per_j").items()) {
    const int64_t j = std::stoll(j_text);
    at::Tensor noise_pred_policy;
    const PredictVelocity policy_velocity =
        [&, predict = predictor(policy)](const at::Tensor& latents, const at::Tensor& timestep) {
          absl::StatusOr<at::Tensor> velocity = predict(latents, timestep);
          if (velocity.ok()) noise_pred_policy = *velocity;
          return velocity;
        };
    DRAY_ASSIGN_OR_RETURN(SdeStepResult step,
                          RecomputeStep(schedule, policy_velocity, trajectory, j, options));
    PolicyLossInput input{advantages.select(1, j), step.log_prob, trajectory.log_probs.select(1, j),
                          step.prev_sample_mean,   at::Tensor(),  step.std_dev_t};
    if (loss_options.beta > 0) {
      at::NoGradGuard no_grad;
      DRAY_ASSIGN_OR_RETURN(SdeStepResult ref,
                            RecomputeStep(schedule, predictor(reference), trajectory, j, options));
      input.prev_sample_mean_ref = ref.prev_sample_mean;
    }
    DRAY_ASSIGN_OR_RETURN(PolicyLossOutput out, loss(input, loss_options));
    out.loss.backward();
    Outputs computed = LossOutputs(out);
    computed.insert({{"transformer_output_policy", policy->output},
                     {"noise_pred_policy", noise_pred_policy},
                     {"prev_sample", trajectory.next_latents.select(1, j)},
                     {"log_prob", step.log_prob},
                     {"prev_sample_mean", step.prev_sample_mean},
                     {"std_dev_t", step.std_dev_t},
                     {"grad_transformer_output_policy", policy->output.grad()},
                     {"prev_sample_mean_ref", input.prev_sample_mean_ref},
                     {"transformer_output_ref", reference->output}});
    json checked = names;
    checked.erase("transformer_hidden_states");  // inputs of the toy model
    checked.erase("transformer_timestep");
    CheckAll(c, data, checked, computed, absl::StrCat("train.j", j, "."), results);
  }
  return results;
}

}  // namespace

std::vector<ParityCase> FlowGrpoParityCases(const std::string& folder) {
  std::vector<ParityCase> cases = RlCasesIn(folder, "/flow_grpo",
                                            {{"sde", RunSdeStep},
                                             {"adv", RunAdvantages},
                                             {"loss", RunLoss},
                                             {"rollout", RunRollout},
                                             {"guard", RunGuard}});
  for (std::vector<ParityCase> more : {RlCasesIn(folder, "/DanceGRPO",
                                                 {{"schedule", RunDanceSchedule},
                                                  {"flux", RunFluxStep},
                                                  {"adv", RunDanceAdvantages},
                                                  {"train", RunDanceChain}}),
                                       RlCasesIn(folder, "/DiffusionNFT",
                                                 {{"nft", RunNftLoss},
                                                  {"return_decay", RunNftDecay},
                                                  {"old_update", RunNftOldUpdate},
                                                  {"sampling", RunNftSampling}})})
    cases.insert(cases.end(), more.begin(), more.end());
  return cases;
}

}  // namespace dray::rl
