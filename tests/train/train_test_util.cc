#include "tests/train/train_test_util.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <utility>

#include "gtest/gtest.h"
#include "runtime/io/safetensors.h"
#include "tests/runtime/test_util.h"
#include "workers/models/qwen_image/model.h"

namespace dray {

std::string SaveDir(const std::string& name) {
  return (std::filesystem::path(std::getenv("TEST_TMPDIR")) / name).string();
}

const std::string& RandomTinyModel() {
  static const std::string dir = [] {
    const std::string path = SaveDir("random_tiny_model");
    absl::Status written = qwen_image::WriteRandomQwenImageModel(
        path, qwen_image::PresetNamed("tiny").value(), /*seed=*/0);
    EXPECT_TRUE(written.ok()) << written;
    return path;
  }();
  return dir;
}

TrainConfig SmallJob(const std::string& save_dir, std::vector<std::string> overrides) {
  overrides.insert(
      overrides.begin(),
      {"worker.image_edit.model_path=" + RandomTinyModel(),
       "worker.image_edit.negative_prompt=\" \"", "data.prompts_per_step=2",
       "algorithm.group_size=2", "worker.rollout.num_inference_steps=4",
       "worker.actor.micro_batch_size=1", "worker.actor.lr=3e-2", "worker.reward.functions=[color]",
       "trainer.total_steps=2", "trainer.save_dir=" + save_dir});
  absl::StatusOr<TrainConfig> config = TrainConfig::Load("", overrides);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

absl::StatusOr<std::unique_ptr<FlowGrpoTrainer>> StartTrainer(const TrainConfig& config,
                                                              int workers,
                                                              FlowGrpoTrainer::Options options) {
  options.launch.workers = workers;
  options.launch.worker_command = {RunfilePath("cli/dray"), "worker"};
  return FlowGrpoTrainer::Start(config, std::move(options));
}

std::vector<nlohmann::json> StepMetrics(const std::string& save_dir) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(save_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

double MeanOf(const std::vector<nlohmann::json>& steps, const char* key, size_t from, size_t to) {
  double sum = 0;
  for (size_t i = from; i < to; ++i) sum += steps[i][key].get<double>();
  return sum / static_cast<double>(to - from);
}

std::map<std::string, at::Tensor> LoraWeights(const std::string& save_dir) {
  std::map<std::string, at::Tensor> weights;
  auto file = SafetensorsFile::Open(save_dir + "/final/pytorch_lora_weights.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return weights;
  for (const std::string& name : (*file)->names()) weights[name] = (*file)->Get(name)->clone();
  return weights;
}

}  // namespace dray
