// Training the VAE (algorithm.name: vae) through real worker processes:
// the loss is the beta-VAE loss (with beta 0, a plain autoencoder's: no
// sampled latents), the reconstruction error falls on the
// embedded pairs with the VAE sharded over two workers, final/ is a model
// directory with the trained VAE beside the untouched components, and a
// stopped and resumed run equals one that never stopped.
#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <torch/csrc/autograd/grad_mode.h>
#include <nlohmann/json.hpp>

#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "runtime/io/safetensors.h"
#include "tests/train/train_test_util.h"
#include "workers/models/component_weights.h"
#include "workers/models/image_resize.h"
#include "workers/models/qwen_image/edit_pipeline.h"
#include "workers/models/qwen_image/model.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/train/flow_grpo_worker.h"
#include "workers/train/train_data.h"
#include "workers/train/vae_training.h"

namespace dray {
namespace {

namespace fs = std::filesystem;

// RandomModel: a random tiny model directory (written once per process).
const std::string& RandomModel() {
  static const std::string dir = [] {
    const std::string path = SaveDir("random_model");
    EXPECT_TRUE(qwen_image::WriteRandomQwenImageModel(path, qwen_image::PresetNamed("tiny").value(),
                                                      /*seed=*/11)
                    .ok());
    return path;
  }();
  return dir;
}

// VaeJob: the VAE trained on the embedded pairs from RandomModel, at 64 pixels.
TrainConfig VaeJob(const std::string& save_dir, std::vector<std::string> overrides) {
  overrides.insert(
      overrides.begin(),
      {"algorithm.name=vae", "algorithm.beta=1e-4", "data.prompts_per_step=4",
       "worker.actor.lr=2e-3", "worker.actor.weight_decay=0", "worker.actor.micro_batch_size=2",
       "worker.rollout.resolution=64", "worker.image_edit.model_path=" + RandomModel(),
       "trainer.save_dir=" + save_dir});
  absl::StatusOr<TrainConfig> config = TrainConfig::Load("", overrides);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

std::map<std::string, at::Tensor> Weights(const std::string& component_dir) {
  std::map<std::string, at::Tensor> weights;
  absl::StatusOr<Checkpoint> checkpoint = OpenComponentWeights(component_dir);
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.status();
  if (!checkpoint.ok()) return weights;
  for (const std::string& name : checkpoint->names()) weights[name] = *checkpoint->Get(name);
  return weights;
}

double MaxDifference(const std::map<std::string, at::Tensor>& a,
                     const std::map<std::string, at::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double most = 0;
  for (const auto& [name, tensor] : a)
    most = std::max(most, (tensor - b.at(name)).abs().max().item<double>());
  return most;
}

TEST(VaeTrainingTest, TheLossIsReconstructionPlusBetaTimesKl) {
  DRAY_ASSERT_OK_AND_ASSIGN(
      qwen_image::QwenImageModel model,
      qwen_image::LoadQwenImageModel(RandomModel(), at::TensorOptions(at::kFloat)));
  torch::NoGradGuard no_grad;
  const at::Tensor pixels = qwen_image::ToPixels({SyntheticScene(3, 64, 64)}, at::kFloat);
  const at::Tensor eps = at::randn({1, 4, 1, 16, 16}, at::kFloat);
  DRAY_ASSERT_OK_AND_ASSIGN(VaeLoss out, VaeReconstructionLoss(*model.vae, pixels, eps, 0.5));
  DRAY_ASSERT_OK_AND_ASSIGN(qwen_image::LatentDistribution posterior, model.vae->Encode(pixels));
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor decoded,
                            model.vae->Decode(posterior.mean + posterior.std * eps));
  const double mse = (decoded - pixels).pow(2).mean().item<double>();
  const at::Tensor mean = posterior.mean, logvar = posterior.logvar;
  const double kl = (0.5 * (mean.pow(2) + logvar.exp() - 1 - logvar)).mean().item<double>();
  EXPECT_NEAR(out.reconstruction_mse.item<double>(), mse, 1e-6);
  EXPECT_NEAR(out.kl.item<double>(), kl, 1e-5 * kl);
  EXPECT_NEAR(out.loss.item<double>(), mse + 0.5 * kl, 1e-5 * (mse + kl));
  EXPECT_FALSE(VaeReconstructionLoss(*model.vae, pixels, eps.narrow(3, 0, 8), 0.5).ok());
}

TEST(VaeTrainingTest, BetaZeroTrainsAPlainAutoencoderOfThePosteriorsMean) {
  const std::string dir = SaveDir("plain");
  DRAY_ASSERT_OK_AND_ASSIGN(
      auto trainer,
      StartTrainer(VaeJob(dir, {"algorithm.beta=0", "worker.actor.micro_batch_size=4"}), 1));
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto batch, trainer->PairedBatch(0));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> updated,
                            trainer->group().Call("vae_update", {batch}));
  DRAY_ASSERT_OK_AND_ASSIGN(double reported, updated.front().GetMeta<double>("loss"));

  // By hand: every input and target, decoded from the posterior's mean.
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<EditRow> rows, DecodeEditRows(batch, 0));
  std::vector<at::Tensor> images;
  for (size_t i = 0; i < rows.size(); ++i) {
    images.push_back(rows[i].images[0]);
    images.push_back(DecodeImageRow((*batch.GetRows<Image>(kTargetsColumn).value())[i]).value());
  }
  for (at::Tensor& image : images) image = ResizeImage(image, 64, 64, Resample::kLanczos).value();
  DRAY_ASSERT_OK_AND_ASSIGN(
      qwen_image::QwenImageModel model,
      qwen_image::LoadQwenImageModel(RandomModel(), at::TensorOptions(at::kFloat)));
  torch::NoGradGuard no_grad;
  const at::Tensor pixels = qwen_image::ToPixels(images, at::kFloat);
  DRAY_ASSERT_OK_AND_ASSIGN(qwen_image::LatentDistribution posterior, model.vae->Encode(pixels));
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor decoded, model.vae->Decode(posterior.mean));
  const double mse = (decoded - pixels).pow(2).mean().item<double>();
  EXPECT_NEAR(reported, mse, 1e-5 * mse);
}

TEST(VaeTrainingTest, TheReconstructionErrorFallsOnTwoShardedWorkers) {
  const std::string dir = SaveDir("falls");
  DRAY_ASSERT_OK_AND_ASSIGN(auto trainer, StartTrainer(VaeJob(dir, {"trainer.total_steps=24"}), 2));
  DRAY_ASSERT_OK(trainer->Run());
  const std::vector<nlohmann::json> metrics = StepMetrics(dir);
  ASSERT_EQ(metrics.size(), 24u);
  auto mean_rmse = [&](size_t from, size_t to) {
    double sum = 0;
    for (size_t i = from; i < to; ++i) sum += metrics[i]["reconstruction_rmse"].get<double>();
    return sum / static_cast<double>(to - from);
  };
  EXPECT_LT(mean_rmse(19, 24), 0.75 * mean_rmse(0, 5));
  EXPECT_TRUE(fs::exists(dir + "/samples/step_0.png"));
  EXPECT_TRUE(fs::exists(dir + "/curves.png"));
  // final/: a model directory; only the VAE changed.
  DRAY_EXPECT_OK(
      qwen_image::LoadQwenImageModel(dir + "/final", at::TensorOptions(at::kFloat)).status());
  EXPECT_GT(MaxDifference(Weights(dir + "/final/vae"), Weights(RandomModel() + "/vae")), 1e-3);
  EXPECT_EQ(
      MaxDifference(Weights(dir + "/final/transformer"), Weights(RandomModel() + "/transformer")),
      0);
}

TEST(VaeTrainingTest, AStopAndAResumeEqualAnUninterruptedRun) {
  const std::string straight = SaveDir("straight"), resumed = SaveDir("resumed");
  for (const auto& [dir, overrides] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {straight, {"trainer.total_steps=4"}},
           {resumed, {"trainer.total_steps=2", "trainer.save_every=2"}},
           {resumed, {"trainer.total_steps=4", "trainer.resume=auto"}}}) {
    DRAY_ASSERT_OK_AND_ASSIGN(auto trainer, StartTrainer(VaeJob(dir, overrides), 1));
    DRAY_ASSERT_OK(trainer->Run());
  }
  EXPECT_LE(MaxDifference(Weights(resumed + "/final/vae"), Weights(straight + "/final/vae")), 1e-6);
  const std::vector<nlohmann::json> a = StepMetrics(straight), b = StepMetrics(resumed);
  ASSERT_EQ(b.size(), 4u);
  for (size_t step = 0; step < 4; ++step)
    EXPECT_NEAR(a[step]["loss"].get<double>(), b[step]["loss"].get<double>(), 1e-6) << step;
}

}  // namespace
}  // namespace dray
