// One Flow-GRPO step with LoRA on a GPU: FlowGrpoWorker (a lone rank, its
// model sharded over NCCL) on the small preset with device cuda and
// torch_dtype bfloat16 over float32 masters, driven as the trainer drives
// it: rollout, the log-probabilities recomputed on-policy, update_actor
// with given advantages, and the adapters saved before and after.
#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/files.h"
#include "base/testing/status_matchers.h"
#include "dispatch/data_proto.h"
#include "gtest/gtest.h"
#include "runtime/io/safetensors.h"
#include "tests/gpu/gpu_test_util.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/train/flow_grpo_worker.h"
#include "workers/train/train_config.h"

namespace dray {
namespace {

using FlowGrpoGpuTest = CudaTest;

// SavedLora: the adapters `worker` saves (meta "dir": `dir`), by name.
std::map<std::string, at::Tensor> SavedLora(FlowGrpoWorker& worker, const std::string& dir) {
  std::map<std::string, at::Tensor> tensors;
  const absl::Status saved = worker.Save(DataProto::Make({}, {}, {{"dir", dir}}).value()).status();
  EXPECT_TRUE(saved.ok()) << saved;
  absl::StatusOr<std::shared_ptr<const SafetensorsFile>> file =
      SafetensorsFile::Open(dir + "/pytorch_lora_weights.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return tensors;
  for (const std::string& name : (*file)->names()) tensors[name] = (*file)->Get(name)->clone();
  return tensors;
}

TEST_F(FlowGrpoGpuTest, OneLoraStepInBfloat16IsFiniteAndMovesTheAdapters) {
  DRAY_ASSERT_OK_AND_ASSIGN(ScratchDir saves, ScratchDir::Create("dray-gpu-grpo"));
  // The embedded task's settings on the small preset, with guidance (as
  // tests/train's SmallJob): 2 prompts x 2 samples, 4 denoising steps.
  DRAY_ASSERT_OK_AND_ASSIGN(
      const TrainConfig config,
      TrainConfig::Load(
          "", {"worker.image_edit.model_path=" + SmallModelDir(), "worker.image_edit.device=cuda",
               "worker.image_edit.torch_dtype=bfloat16", "worker.image_edit.negative_prompt=\" \"",
               "data.prompts_per_step=2", "algorithm.group_size=2",
               "worker.rollout.num_inference_steps=4", "worker.actor.micro_batch_size=2",
               "trainer.save_dir=" + saves.path()}));
  ASSERT_GT(config.lora_rank, 0);
  std::unique_ptr<FlowGrpoWorker> worker = LoneWorker<FlowGrpoWorker>();
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto init, DataProto::Make({}, {}, {{"config", config.ToYaml()}}));
  DRAY_ASSERT_OK(worker->InitModel(init).status());

  // A group shares its prompt and image; each row has its own seed.
  const std::string green = TestPng(40, 56, 0), purple = TestPng(48, 40, 1);
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto rows,
                            MakeEditBatch({green, green, purple, purple},
                                          {"make the sky green", "make the sky green",
                                           "make the sky purple", "make the sky purple"},
                                          {100, 101, 102, 103}));
  const int64_t window = config.num_inference_steps - 1;  // every step but the last is stochastic
  rows.SetMeta(kSdeWindowBeginKey, int64_t{0});
  rows.SetMeta(kSdeWindowEndKey, window);
  rows.SetMeta(kReturnTrajectoryKey, true);
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto rollout, worker->Rollout(rows));
  for (const char* column :
       {kLatentsColumn, kNextLatentsColumn, kLogProbsColumn, kTimestepsColumn}) {
    DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor tensor, rollout.GetTensor(column));
    EXPECT_EQ(tensor.size(0), 4) << column;
    EXPECT_TRUE(AllFinite(tensor)) << column;
  }
  DRAY_ASSERT_OK_AND_ASSIGN(const at::Tensor old_log_probs, rollout.GetTensor(kLogProbsColumn));
  EXPECT_EQ(old_log_probs.sizes(), (std::vector<int64_t>{4, window}));
  // The worker keeps its rollout; these name its rows.
  DRAY_ASSERT_OK_AND_ASSIGN(const DataProto kept,
                            DataProto::Make({{kRolloutRowColumn, at::arange(4, at::kLong)}}));

  // On-policy, the recomputed log-probabilities are the rollout's. Once a
  // ratio leaves [1 - clip_range, 1 + clip_range], the clipped GRPO loss has
  // no gradient there: training would stall without an error.
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto recomputed, worker->ComputeLogProb(kept));
  DRAY_ASSERT_OK_AND_ASSIGN(const at::Tensor log_probs, recomputed.GetTensor(kLogProbsColumn));
  ExpectErrorWithin("recomputed_ratio_error",
                    (at::exp(log_probs - old_log_probs) - 1).abs().max().item<double>(),
                    config.clip_range);

  const std::map<std::string, at::Tensor> initial = SavedLora(*worker, saves.path() + "/before");
  DataProto update = kept;
  DRAY_ASSERT_OK(
      update.AddTensor(kAdvantagesColumn, at::tensor({1.0, -1.0, -1.0, 1.0}, at::kDouble)));
  std::vector<int64_t> train_steps(window);
  std::iota(train_steps.begin(), train_steps.end(), 0);
  update.SetMeta(kTrainStepsKey, Json{absl::StrCat("[", absl::StrJoin(train_steps, ","), "]")});
  update.SetMeta(kLearningRateKey, config.lr);
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto metrics, worker->UpdateActor(update));
  for (const char* name :
       {"loss", "policy_loss", "kl", "approx_kl", "clipfrac", "ratio_mean", "grad_norm"}) {
    DRAY_ASSERT_OK_AND_ASSIGN(double value, metrics.GetMeta<double>(name));
    EXPECT_TRUE(std::isfinite(value)) << name << " = " << value;
  }
  EXPECT_GT(metrics.GetMeta<double>("grad_norm").value(), 0);
  ExpectErrorWithin("update_ratio_mean_error",
                    std::abs(metrics.GetMeta<double>("ratio_mean").value() - 1), config.clip_range);
  EXPECT_EQ(metrics.GetMeta<double>("clipfrac").value(), 0.0);
  const std::map<std::string, at::Tensor> trained = SavedLora(*worker, saves.path() + "/after");

  // The adapters, saved from their float32 masters: finite, and moved. LoRA's
  // B starts at zero, so the step moves B (by about lr under Adam) and
  // leaves A (whose gradient is B^T times the output's) as it was but for
  // weight decay. Every adapter of the first block feeds the loss.
  ASSERT_FALSE(initial.empty());
  ASSERT_EQ(trained.size(), initial.size());
  int moved = 0;
  for (const auto& [name, tensor] : trained) {
    EXPECT_EQ(tensor.scalar_type(), at::kFloat) << name;
    EXPECT_TRUE(AllFinite(tensor)) << name;
    if (!absl::StrContains(name, "lora_B")) continue;
    const bool changed = !at::equal(tensor, initial.at(name));
    moved += changed ? 1 : 0;
    if (absl::StrContains(name, ".transformer_blocks.0.")) {
      EXPECT_TRUE(changed) << name;
    }
  }
  EXPECT_GT(moved, 0) << "the step changed no adapter";

  // The policy moved: other log-probabilities for the same trajectory, finite.
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto moved_policy, worker->ComputeLogProb(kept));
  DRAY_ASSERT_OK_AND_ASSIGN(const at::Tensor new_log_probs,
                            moved_policy.GetTensor(kLogProbsColumn));
  EXPECT_TRUE(AllFinite(new_log_probs));
  EXPECT_GT((new_log_probs - old_log_probs).abs().max().item<double>(), 0);
}

}  // namespace
}  // namespace dray
