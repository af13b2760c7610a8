#include "workers/parity/dpo_parity.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "workers/parity/rl_case.h"
#include "workers/rl/dpo_loss.h"

namespace dray::rl {
namespace {

using nlohmann::json;

// Paired: the first half of `draws` for both halves, as both scripts share
// a pair's noise (and timestep).
at::Tensor Paired(const at::Tensor& draws) {
  const at::Tensor first = draws.narrow(0, 0, draws.size(0) / 2);
  return at::cat({first, first});
}

// RunDpo: one case of either loss. flow_grpo's target is the velocity
// noise - x0 (its logit-normal timestep's u = sigmoid(normal)); DiffusionDPO's
// the noise.
absl::StatusOr<std::vector<ParityResult>> RunDpo(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const bool flow = c.name.rfind("flow_dpo.", 0) == 0;
  const at::Tensor noise = Paired(data.Input("noise_draw"));
  const at::Tensor target = flow ? noise - data.Input("latents") : noise;
  const at::Tensor prediction = data.Input("model_pred").requires_grad_(true);
  const json& params = data.spec.at("params");
  const DpoLossOptions options{
      params.at(flow ? "config.train.beta" : "beta_dpo").get<double>(),
      params.at(flow ? "accelerate_gradient_accumulation_steps" : "gradient_accumulation_steps")
          .get<int64_t>()};
  DRAY_ASSIGN_OR_RETURN(
      DpoLossOutput out,
      DpoLoss({prediction, data.Input(flow ? "model_pred_ref" : "ref_pred"), target}, options));
  out.loss.backward();
  const int64_t pairs = out.inside.size(0);
  auto chosen = [&](const at::Tensor& t) { return t.narrow(0, 0, pairs); };
  auto rejected = [&](const at::Tensor& t) { return t.narrow(0, pairs, pairs); };
  Outputs computed = {{"noise", noise},
                      {"target", target},
                      {"w_l_diff", out.w_l_diff},
                      {"inside_term", out.inside},
                      {"implicit_acc", out.implicit_acc},
                      {"loss", out.unscaled_loss},
                      {"grad_model_pred", prediction.grad()}};
  if (flow) {
    computed.insert({{"u", at::sigmoid(data.Input("u_normal_draw"))},
                     {"theta_mse", out.mse},
                     {"ref_mse", out.ref_mse},
                     {"model_w_err", chosen(out.mse)},
                     {"model_l_err", rejected(out.mse)},
                     {"ref_w_err", chosen(out.ref_mse)},
                     {"ref_l_err", rejected(out.ref_mse)}});
    for (const char* logged : {"loss", "model_w_err", "model_l_err", "ref_w_err", "ref_l_err",
                               "w_l_diff", "inside_term", "implicit_acc"})
      computed[absl::StrCat("info.", logged)] = computed.at(logged).mean();
  } else {
    computed.insert({{"model_losses", out.mse},
                     {"model_losses_w", chosen(out.mse)},
                     {"model_losses_l", rejected(out.mse)},
                     {"model_diff", out.model_diff},
                     {"ref_losses", out.ref_mse},
                     {"ref_losses_w", chosen(out.ref_mse)},
                     {"ref_losses_l", rejected(out.ref_mse)},
                     {"ref_diff", out.ref_diff}});
  }
  json outputs = data.spec.at("outputs");
  for (const char* not_dray : {"bsz", "indices", "timesteps", "sigmas", "noisy_model_input",
                               "w_diff", "l_diff", "raw_model_loss", "raw_ref_loss"})
    outputs.erase(not_dray);
  std::vector<ParityResult> results;
  CheckAll(c, data, outputs, computed, "", results);
  if (data.spec.contains("info"))
    CheckPart(c, data, "info", computed, results, {"w_diff", "l_diff"});
  CheckAll(c, data, data.spec.at("gradients"), computed, "", results);
  return results;
}

// RunTracker: flow_grpo's pair selection, as advantages: +1 the chosen,
// -1 the rejected, 0 the others.
absl::StatusOr<std::vector<ParityResult>> RunTracker(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const at::Tensor rewards = data.Input("rewards").to(at::kDouble).contiguous();
  const std::vector<std::string> groups = data.Param("prompts").get<std::vector<std::string>>();
  DRAY_ASSIGN_OR_RETURN(
      std::vector<DpoPair> pairs,
      DpoPairs(groups, std::vector<double>(rewards.data_ptr<double>(),
                                           rewards.data_ptr<double>() + rewards.numel())));
  at::Tensor advantages = at::zeros({rewards.size(0)}, data.Input("rewards").options());
  for (const DpoPair& pair : pairs) {
    advantages[pair.chosen] = 1;
    advantages[pair.rejected] = -1;
  }
  std::vector<ParityResult> results;
  CheckAll(c, data, data.spec.at("outputs"), {{"advantages", advantages}}, "", results);
  return results;
}

}  // namespace

std::vector<ParityCase> DpoParityCases(const std::string& folder) {
  return RlCasesIn(folder, "/DiffusionDPO",
                   {{"flow_dpo", RunDpo}, {"diffusion_dpo", RunDpo}, {"tracker", RunTracker}});
}

}  // namespace dray::rl
