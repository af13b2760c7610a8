// Supervised fine-tuning (algorithm.name: sft) through real worker
// processes: the loss the workers report is the flow-matching loss computed
// here by hand on the same tiny model, it falls as training goes on, and
// pairs of several sizes train a size a step, each at its aspect ratio.
#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <utility>

#include <torch/csrc/autograd/grad_mode.h>
#include <nlohmann/json.hpp>

#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "tests/train/train_test_util.h"
#include "workers/models/qwen_image/edit_pipeline.h"
#include "workers/models/qwen_image/model.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/train/flow_grpo_worker.h"
#include "workers/train/train_data.h"

namespace dray {
namespace {

namespace fs = std::filesystem;

TEST(SftTest, TheLossIsTheFlowMatchingLossComputedByHand) {
  const std::string dir = SaveDir("by_hand");
  fs::create_directories(dir + "/data");
  DRAY_ASSERT_OK_AND_ASSIGN(std::string data, WriteSyntheticEditPairs(dir + "/data", 1, 100));
  DRAY_ASSERT_OK_AND_ASSIGN(qwen_image::ModelPreset tiny, qwen_image::PresetNamed("tiny"));
  DRAY_ASSERT_OK(qwen_image::WriteRandomQwenImageModel(dir + "/model", tiny, /*seed=*/5));
  const TrainConfig config =
      SmallJob(dir + "/run", {"algorithm.name=sft", "data.train_files=" + data,
                              "worker.image_edit.model_path=" + dir + "/model",
                              "worker.actor.micro_batch_size=2", "worker.rollout.resolution=64"});
  DRAY_ASSERT_OK_AND_ASSIGN(auto trainer, StartTrainer(config, 1));
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto batch, trainer->PairedBatch(0));
  ASSERT_EQ(batch.size(), 2);
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> updated,
                            trainer->group().Call("sft_update", {batch}));
  DRAY_ASSERT_OK_AND_ASSIGN(double reported, updated.front().GetMeta<double>("loss"));

  // By hand, on the same weights (the LoRA adapters start at zero).
  torch::NoGradGuard no_grad;
  DRAY_ASSERT_OK_AND_ASSIGN(
      qwen_image::QwenImageModel model,
      qwen_image::LoadQwenImageModel(dir + "/model", at::TensorOptions().dtype(at::kFloat)));
  qwen_image::QwenImageEditPipeline pipeline(std::move(model));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<EditRow> rows, DecodeEditRows(batch, 0));
  std::vector<qwen_image::EditInput> inputs;
  for (const EditRow& row : rows) inputs.push_back({row.images, row.instruction, row.seed});
  qwen_image::EditOptions options;
  options.image_size = 64;
  options.width = options.height = 64;
  DRAY_ASSERT_OK_AND_ASSIGN(qwen_image::PreparedEdit prepared,
                            pipeline.Prepare({&inputs[0], &inputs[1]}, options));
  const std::vector<Image>& target_rows = *batch.GetRows<Image>(kTargetsColumn).value();
  std::vector<at::Tensor> targets;
  for (const Image& row : target_rows) targets.push_back(DecodeImageRow(row).value());
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor x0, pipeline.EncodeImages(targets));  // already 64x64
  DRAY_ASSERT_OK_AND_ASSIGN(auto schedule, pipeline.Scheduler(prepared.noise.size(1), 1000));
  const at::Tensor draws = batch.GetTensor(kSigmaDrawsColumn).value();
  double loss = 0;
  for (int64_t b = 0; b < 2; ++b) {
    const int64_t index = static_cast<int64_t>(std::floor(draws[b].item<double>() * 1000));
    const double sigma = schedule.sigmas()[index].item<double>();
    const at::Tensor noise = prepared.noise.narrow(0, b, 1), clean = x0.narrow(0, b, 1);
    qwen_image::PreparedEdit row = prepared;
    row.noise = noise;
    row.image_latents = prepared.image_latents.narrow(0, b, 1);
    row.prompt = {prepared.prompt.embeds.narrow(0, b, 1), prepared.prompt.mask.narrow(0, b, 1)};
    row.shapes = {prepared.shapes[b]};
    DRAY_ASSERT_OK_AND_ASSIGN(
        at::Tensor velocity,
        pipeline.Velocity(row, (1 - sigma) * clean + sigma * noise,
                          schedule.timesteps().narrow(0, index, 1), /*true_cfg_scale=*/1.0));
    loss += (velocity - (noise - clean)).pow(2).mean().item<double>() / 2;
  }
  EXPECT_NEAR(reported, loss, 1e-5 * loss);
}

TEST(SftTest, PairsOfSeveralSizesTrainOneSizeAStepAtTheirAspectRatio) {
  const std::string dir = SaveDir("sizes");
  fs::create_directories(dir + "/data");
  DRAY_ASSERT_OK_AND_ASSIGN(std::string data,
                            WriteSyntheticEditPairs(dir + "/data", 4, 100, {{64, 64}, {48, 80}}));
  const TrainConfig config =
      SmallJob(dir + "/run",
               {"algorithm.name=sft", "data.train_files=" + data, "data.prompts_per_step=4",
                "trainer.total_steps=4", "trainer.sample_every=1", "worker.rollout.resolution=64"});
  DRAY_ASSERT_OK_AND_ASSIGN(auto trainer, StartTrainer(config, 2));
  std::set<std::pair<int64_t, int64_t>> sizes_seen;
  for (int64_t step = 0; step < 8; ++step) {
    DRAY_ASSERT_OK_AND_ASSIGN(DataProto batch, trainer->PairedBatch(step));
    DRAY_ASSERT_OK_AND_ASSIGN(std::vector<EditRow> rows, DecodeEditRows(batch, 0));
    for (const EditRow& row : rows) {
      EXPECT_EQ(row.images[0].sizes(), rows.front().images[0].sizes()) << "step " << step;
    }
    sizes_seen.insert({rows.front().images[0].size(0), rows.front().images[0].size(1)});
    // Each rank edits (as sft_update prepares) its rows at their aspect
    // ratio: about 64^2 pixels, sides multiples of 32, as the edit pipeline
    // sizes them.
    const bool wide = rows.front().images[0].size(1) > rows.front().images[0].size(0);
    DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> edited,
                              trainer->group().Call("edit", {batch}));
    for (const Image& output : *edited.front().GetRows<Image>(kEditedColumn).value()) {
      EXPECT_EQ(output.height, 64) << "step " << step;
      EXPECT_EQ(output.width, wide ? 96 : 64) << "step " << step;
    }
  }
  EXPECT_EQ(sizes_seen.size(), 2u) << "eight steps drew pairs of one size only";
  DRAY_ASSERT_OK(trainer->Run());  // four steps over two ranks, a size a step
  EXPECT_TRUE(fs::exists(dir + "/run/samples/step_3.png"));
}

TEST(SftTest, TheLossFallsOnTheEmbeddedPairs) {
  const std::string dir = SaveDir("falls");
  DRAY_ASSERT_OK_AND_ASSIGN(
      auto trainer,
      StartTrainer(TrainConfig::Load("", {"algorithm.name=sft", "trainer.total_steps=20",
                                          "worker.image_edit.model_path=" + RandomTinyModel(),
                                          "worker.actor.lr=3e-2", "trainer.save_dir=" + dir})
                       .value(),
                   2));
  DRAY_ASSERT_OK(trainer->Run());
  std::ifstream in(dir + "/metrics.jsonl");
  std::vector<double> losses;
  for (std::string line; std::getline(in, line);)
    losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  ASSERT_EQ(losses.size(), 20u);
  auto mean = [&](size_t from, size_t to) {
    double sum = 0;
    for (size_t i = from; i < to; ++i) sum += losses[i];
    return sum / static_cast<double>(to - from);
  };
  EXPECT_LT(mean(15, 20), 0.7 * mean(0, 5));
  EXPECT_TRUE(fs::exists(dir + "/samples/step_0.png"));
  EXPECT_TRUE(fs::exists(dir + "/final/pytorch_lora_weights.safetensors"));
}

}  // namespace
}  // namespace dray
