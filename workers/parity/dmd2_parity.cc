#include "workers/parity/dmd2_parity.h"

#include <ATen/ATen.h>

#include "base/status_macros.h"
#include "workers/parity/rl_case.h"
#include "workers/rl/dmd2.h"
#include "workers/rl/per_sample.h"

namespace dray::rl {
namespace {

using nlohmann::json;

// ToyScore: the reference's toy UNet (cases.json toy_models): prediction
// a tanh(x) + b x + c e + d t / 1000 with e the per-row mean of the text
// embedding; in classify mode the features tanh(a x + c e + d t / 1000).
// Float32 throughout, in the reference's order of operations.
struct ToyScore {
  double a, b, c, d;

  static ToyScore From(const json& parameters) {
    const auto p = parameters.get<std::vector<double>>();
    return {p.at(0), p.at(1), p.at(2), p.at(3)};
  }
  at::Tensor Prediction(const at::Tensor& x, const at::Tensor& t, const at::Tensor& text) const {
    return a * at::tanh(x) + b * x + c * Embedded(text, x) + d * Level(t, x);
  }
  at::Tensor Features(const at::Tensor& x, const at::Tensor& t, const at::Tensor& text) const {
    return at::tanh(a * x + c * Embedded(text, x) + d * Level(t, x));
  }
  static at::Tensor Embedded(const at::Tensor& text, const at::Tensor& x) {
    return text.mean({1, 2}).view(PerSampleShape(x));
  }
  static at::Tensor Level(const at::Tensor& t, const at::Tensor& x) {
    return t.to(x.scalar_type()).view(PerSampleShape(x)) / 1000;
  }
};

// ToyLogits: the reference's classifier head, mean(w features) + bias, [B, 1].
at::Tensor ToyLogits(const json& head, const at::Tensor& features) {
  const auto p = head.get<std::vector<double>>();
  return ((p.at(0) * features).mean({1, 2, 3}, /*keepdim=*/true) + p.at(1)).view({-1, 1});
}

// Checked: `computed` against the case's outputs and, where it has them,
// its gradients.
std::vector<ParityResult> Checked(const ParityCase& c, const RlCase& data,
                                  const Outputs& computed) {
  std::vector<ParityResult> results;
  CheckAll(c, data, data.spec.at("outputs"), computed, "", results);
  if (data.spec.contains("gradients"))
    CheckAll(c, data, data.spec.at("gradients"), computed, "", results);
  return results;
}

ScoreParametrization Epsilon(const RlCase& data) {
  return ScoreParametrization::Epsilon(data.Input("alphas_cumprod"));
}

// RunDistributionMatching: compute_distribution_matching_loss, the real
// score guided when its scale exceeds 1 (one call on [uncond; cond] rows).
absl::StatusOr<std::vector<ParityResult>> RunDistributionMatching(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const ScoreParametrization eps = Epsilon(data);
  const ToyScore real = ToyScore::From(data.Param("real_unet"));
  const ToyScore fake = ToyScore::From(data.Param("fake_unet"));
  const double scale = data.Param("real_guidance_scale").get<double>();
  const at::Tensor latents = data.Input("latents").requires_grad_(true);
  const at::Tensor text = data.Input("text_embedding");
  const at::Tensor t = data.Input("timesteps");
  const at::Tensor noisy = eps.Noised(latents.detach(), data.Input("noise"), t);
  const at::Tensor fake_noise = fake.Prediction(noisy, t, text);
  at::Tensor real_noise, real_guided;
  if (scale > 1) {
    const at::Tensor uncond = real.Prediction(noisy, t, data.Input("uncond_embedding"));
    const at::Tensor cond = real.Prediction(noisy, t, text);
    real_noise = at::cat({uncond, cond});
    real_guided = GuidedPrediction(uncond, cond, scale);
  } else {
    real_noise = real_guided = real.Prediction(noisy, t, text);
  }
  const at::Tensor real_x0 = eps.CleanPrediction(noisy, real_guided, t);
  const at::Tensor fake_x0 = eps.CleanPrediction(noisy, fake_noise, t);
  DRAY_ASSIGN_OR_RETURN(DistributionMatching dm,
                        DistributionMatchingLoss(latents, real_x0, fake_x0));
  dm.loss.backward();
  const Outputs computed = {{"loss_dm", dm.loss},
                            {"noisy_latents", noisy},
                            {"pred_real_image", real_x0},
                            {"pred_fake_image", fake_x0},
                            {"grad", dm.grad},
                            {"gradient_norm", dm.grad.norm()},
                            {"pred_real_noise", real_noise},
                            {"pred_fake_noise", fake_noise},
                            {"grad_latents", latents.grad()}};
  return Checked(c, data, computed);
}

// RunFakeScore: compute_loss_fake, the fake score trained toward the noise.
absl::StatusOr<std::vector<ParityResult>> RunFakeScore(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const ScoreParametrization eps = Epsilon(data);
  const at::Tensor latents = data.Input("latents");
  const at::Tensor noise = data.Input("noise");
  const at::Tensor t = data.Input("timesteps");
  const at::Tensor noisy = eps.Noised(latents, noise, t);
  const at::Tensor prediction = ToyScore::From(data.Param("fake_unet"))
                                    .Prediction(noisy, t, data.Input("text_embedding"))
                                    .requires_grad_(true);
  const at::Tensor loss = DenoisingLoss(prediction, eps.Target(latents, noise));
  loss.backward();
  const Outputs computed = {{"loss_fake_mean", loss},
                            {"noisy_latents", noisy},
                            {"x0_pred", eps.CleanPrediction(noisy, prediction.detach(), t)},
                            {"fake_noise_pred", prediction},
                            {"grad_fake_noise_pred", prediction.grad()}};
  return Checked(c, data, computed);
}

// Logits: compute_cls_logits on `image`: the fake score's features (after
// diffusion GAN noise, draws named `suffix`, when the case has it) through
// the head.
at::Tensor Logits(const RlCase& data, const at::Tensor& image, const at::Tensor& text,
                  const std::string& suffix) {
  at::Tensor input = image;
  at::Tensor t = at::zeros({image.size(0)}, at::kLong);
  if (data.Param("diffusion_gan").get<bool>()) {
    t = data.Input("gan_timesteps" + suffix);
    input = Epsilon(data).Noised(image, data.Input("gan_noise" + suffix), t);
  }
  const at::Tensor features = ToyScore::From(data.Param("fake_unet")).Features(input, t, text);
  return ToyLogits(data.Param("cls_pred_branch"), features.to(at::kFloat));
}

// RunGeneratorGan: compute_generator_clean_cls_loss on the generator's samples.
absl::StatusOr<std::vector<ParityResult>> RunGeneratorGan(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const at::Tensor image = data.Input("latents").requires_grad_(true);
  at::Tensor logits = Logits(data, image, data.Input("text_embedding"), "");
  logits.retain_grad();
  const at::Tensor loss = GeneratorGanLoss(logits);
  loss.backward();
  const Outputs computed = {{"gen_cls_loss", loss},
                            {"logits_fake", logits},
                            {"grad_logits_fake", logits.grad()},
                            {"grad_image", image.grad()}};
  return Checked(c, data, computed);
}

// RunClassifierGan: compute_guidance_clean_cls_loss, real latents with the
// uncond embedding as their text (cases.json params.text_embeddings).
absl::StatusOr<std::vector<ParityResult>> RunClassifierGan(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const at::Tensor real =
      Logits(data, data.Input("real_latents"), data.Input("uncond_embedding"), "_real")
          .requires_grad_(true);
  const at::Tensor fake = Logits(data, data.Input("latents"), data.Input("text_embedding"), "_fake")
                              .requires_grad_(true);
  const at::Tensor loss = ClassifierGanLoss(real, fake);
  loss.backward();
  const Outputs computed = {{"guidance_cls_loss", loss},
                            {"logits_real", real},
                            {"logits_fake", fake},
                            {"pred_realism_on_real", at::sigmoid(real).squeeze(1)},
                            {"pred_realism_on_fake", at::sigmoid(fake).squeeze(1)},
                            {"grad_logits_real", real.grad()},
                            {"grad_logits_fake", fake.grad()}};
  return Checked(c, data, computed);
}

// RunBackwardSimulation: the generator's turn as prepare_denoising_data
// makes its input with backward simulation, then the generator's x0.
absl::StatusOr<std::vector<ParityResult>> RunBackwardSimulation(const ParityCase& c) {
  DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
  const ScoreParametrization eps = Epsilon(data);
  DRAY_ASSIGN_OR_RETURN(std::vector<int64_t> steps,
                        DenoisingSteps(data.Param("denoising_timestep").get<int64_t>(),
                                       data.Param("num_denoising_step").get<int64_t>()));
  const ToyScore toy = ToyScore::From(data.Param("generator"));
  const at::Tensor text = data.Input("text_embedding");
  std::vector<at::Tensor> predictions;
  auto x0_at = [&](const at::Tensor& xt, int64_t timestep) {
    const at::Tensor t = at::full({xt.size(0)}, timestep, at::kLong);
    predictions.push_back(toy.Prediction(xt, t, text));
    return eps.CleanPrediction(xt, predictions.back(), t).to(at::kFloat);
  };
  int renoised = 0;
  auto draw = [&](const at::Tensor&) { return data.Input("renoise" + std::to_string(renoised++)); };
  const int64_t selected = data.Input("selected_step").item<int64_t>();
  const SimulatedInput simulated =
      BackwardSimulated(eps, steps, selected, data.Input("start_noise"), x0_at, draw);
  const at::Tensor input =
      GeneratorInput(eps, simulated.clean, data.Input("noise"), simulated.timestep);
  const at::Tensor generated = x0_at(input, simulated.timestep);
  const Outputs computed = {
      {"denoising_timestep", at::full({input.size(0)}, simulated.timestep, at::kLong)},
      {"generated_image", generated},
      {"generator_outputs", at::stack(predictions)}};
  return Checked(c, data, computed);
}

absl::StatusOr<std::vector<ParityResult>> RunGan(const ParityCase& c) {
  return c.name.find(".generator") != std::string::npos ? RunGeneratorGan(c) : RunClassifierGan(c);
}

}  // namespace

std::vector<ParityCase> Dmd2ParityCases(const std::string& folder) {
  return RlCasesIn(folder, "/DMD2",
                   {{"dm", RunDistributionMatching},
                    {"fake", RunFakeScore},
                    {"gan", RunGan},
                    {"backsim", RunBackwardSimulation}});
}

}  // namespace dray::rl
