#include "workers/train/memory_plan.h"

#include <string>

#include "base/files.h"
#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "workers/models/flux/model.h"
#include "workers/train/plan_model.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t k24GiB = int64_t{24} << 30;

int64_t Term(const MemoryPlan& plan, const std::string& name) {
  for (const MemoryTerm& term : plan.terms) {
    if (term.name == name) return term.bytes;
  }
  ADD_FAILURE() << "no term " << name;
  return 0;
}

PlanOptions FourRanks(ShardingStrategy strategy = ShardingStrategy::kFullShard) {
  PlanOptions options;
  options.world_size = 4;
  options.strategy = strategy;
  return options;
}

TEST(PlanModelTest, CountsFluxKontextDevExactly) {
  DRAY_ASSERT_OK_AND_ASSIGN(PlanModel full, LoadPlanModel("flux-real", {}));
  EXPECT_EQ(full.parameters(), 11901408320);
  EXPECT_EQ(full.trainable(), full.parameters());
  ASSERT_EQ(full.units.size(), 57u);
  EXPECT_EQ(full.units[0].kind, BlockKind::kDualStream);
  EXPECT_EQ(full.units[19].kind, BlockKind::kSingleStream);
  ASSERT_EQ(full.frozen.size(), 3u);
  EXPECT_EQ(full.frozen[0].parameters, 4762310656);  // T5-XXL's encoder
  EXPECT_EQ(full.frozen[1].parameters, 123060480);   // CLIP-L
  EXPECT_EQ(full.frozen[2].parameters, 83819683);    // the VAE

  // LoRA rank 32 on diffusers' FLUX.1 targets: r (in + out) for each of 12
  // layers of a dual-stream block (8 of 3072 x 3072, 4 of 3072 x 12288)
  // and 3 of a single-stream one.
  DRAY_ASSERT_OK_AND_ASSIGN(PlanModel lora, LoadPlanModel("flux-real", {32, {}}));
  EXPECT_EQ(lora.trainable(), 19 * 32 * (8 * 6144 + 4 * 15360) + 38 * 32 * 3 * 6144);
  EXPECT_EQ(lora.replicated_trainable, 0);
  const BlockTraining& dual = lora.units[0].training;
  EXPECT_FALSE(dual.modulation);
  EXPECT_TRUE(dual.projections && dual.attention_out && dual.mlp_in && dual.mlp_out);
  const BlockTraining& single = lora.units[56].training;
  EXPECT_TRUE(single.projections);
  EXPECT_FALSE(single.modulation || single.qk_norms || single.attention_out);
}

TEST(PlanModelTest, ModelDirectoriesCountAsTheirPreset) {
  DRAY_ASSERT_OK_AND_ASSIGN(ScratchDir dir, ScratchDir::Create("plan-flux-tiny"));
  DRAY_ASSERT_OK(flux::WriteRandomFluxKontextModel(
      dir.path(), flux::FluxPresetNamed("flux-tiny").value(), /*seed=*/0));
  DRAY_ASSERT_OK_AND_ASSIGN(PlanModel from_dir, LoadPlanModel(dir.path(), {4, {}}));
  DRAY_ASSERT_OK_AND_ASSIGN(PlanModel preset, LoadPlanModel("flux-tiny", {4, {}}));
  EXPECT_EQ(from_dir.parameters(), preset.parameters());
  EXPECT_EQ(from_dir.trainable(), preset.trainable());
  EXPECT_EQ(from_dir.frozen[0].parameters, preset.frozen[0].parameters);
}

TEST(PlanModelTest, QwenImagePresetsAndBadNames) {
  DRAY_ASSERT_OK_AND_ASSIGN(PlanModel qwen, LoadPlanModel("real", {}));
  EXPECT_EQ(qwen.parameters(), 20430401088);
  EXPECT_EQ(qwen.units.size(), 60u);
  EXPECT_THAT(LoadPlanModel("flux-huge", {}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("flux-huge")));
  EXPECT_THAT(LoadPlanModel("/no/such/model", {}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("--model")));
  EXPECT_THAT(LoadPlanModel("flux-tiny", {4, {"no_such_layer"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no_such_layer")));
  EXPECT_THAT(LoadPlanModel("flux-tiny", {-1, {}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--lora-rank")));
}

TEST(MemoryPlanTest, ShardedStateIsSixteenBytesATrainableParameterOverW) {
  DRAY_ASSERT_OK_AND_ASSIGN(PlanModel model, LoadPlanModel("flux-real", {}));
  DRAY_ASSERT_OK_AND_ASSIGN(MemoryPlan plan, PlanMemory(model, FourRanks()));
  int64_t local = model.replicated_trainable;  // N: this rank's masters
  for (const PlanUnit& unit : model.units) local += (unit.trainable + 3) / 4;
  EXPECT_EQ(Term(plan, "optimizer"), 8 * local);  // AdamW's moments
  EXPECT_GE(Term(plan, "parameters"), 4 * local);
  // LibTorch 2's zero_grad frees the master gradients: at the peak, the
  // last block's backward, none is back yet. 1.13's zeroes and keeps them.
  EXPECT_LT(Term(plan, "gradients"), local);
  PlanOptions old = FourRanks();
  old.libtorch = LibTorch::k1_13;
  old.attention = AttentionKernel::kBlockwise;
  DRAY_ASSERT_OK_AND_ASSIGN(MemoryPlan kept, PlanMemory(model, old));
  EXPECT_GE(Term(kept, "gradients"), 4 * local);

  // CPU offload keeps the units' masters, their gradients and moments on
  // the host; the replicated ones stay on the device.
  PlanOptions offload = FourRanks();
  offload.cpu_offload = true;
  DRAY_ASSERT_OK_AND_ASSIGN(MemoryPlan offloaded, PlanMemory(model, offload));
  const int64_t replicated = model.replicated_trainable;
  EXPECT_EQ(Term(offloaded, "optimizer"), 8 * replicated);
  EXPECT_EQ(offloaded.host_bytes, 16 * (local - replicated));
  EXPECT_EQ(Term(plan, "parameters") - Term(offloaded, "parameters"), 4 * (local - replicated));
}

TEST(MemoryPlanTest, ShardGradOpKeepsEveryUnitGatheredUntilBackward) {
  DRAY_ASSERT_OK_AND_ASSIGN(PlanModel model, LoadPlanModel("flux-real", {32, {}}));
  DRAY_ASSERT_OK_AND_ASSIGN(MemoryPlan full_shard, PlanMemory(model, FourRanks()));
  DRAY_ASSERT_OK_AND_ASSIGN(MemoryPlan grad_op,
                            PlanMemory(model, FourRanks(ShardingStrategy::kShardGradOp)));
  // The transformer in bfloat16, its adapters padded to 4 ranks, less the
  // one unit FULL_SHARD holds: 22 GiB more.
  EXPECT_GT(Term(grad_op, "parameters") - Term(full_shard, "parameters"), int64_t{21} << 30);
}

TEST(MemoryPlanTest, CheckpointingKeepsOnlyBlockInputs) {
  DRAY_ASSERT_OK_AND_ASSIGN(PlanModel model, LoadPlanModel("flux-real", {32, {}}));
  PlanOptions options = FourRanks();
  DRAY_ASSERT_OK_AND_ASSIGN(MemoryPlan kept, PlanMemory(model, options));
  options.activation_checkpointing = true;
  DRAY_ASSERT_OK_AND_ASSIGN(MemoryPlan recomputed, PlanMemory(model, options));
  // 57 blocks' activations against their 58 inputs and one block's.
  EXPECT_GT(Term(kept, "activations"), 10 * Term(recomputed, "activations"));
  const int64_t inputs = 58 * int64_t{8704} * 3072 * 2;
  EXPECT_GT(Term(recomputed, "activations"), inputs);
}

TEST(MemoryPlanTest, KontextOnFour24GiBCards) {
  DRAY_ASSERT_OK_AND_ASSIGN(PlanModel lora, LoadPlanModel("flux-real", {32, {}}));
  DRAY_ASSERT_OK_AND_ASSIGN(PlanModel full, LoadPlanModel("flux-real", {}));
  PlanOptions options = FourRanks();
  options.text_encoders = Placement::kResident;  // the original goal's (dray train shards T5)
  DRAY_ASSERT_OK_AND_ASSIGN(MemoryPlan no_checkpointing, PlanMemory(lora, options));
  FitVerdict verdict = Verdict(no_checkpointing, k24GiB);
  EXPECT_FALSE(verdict.fits);
  EXPECT_EQ(verdict.dominant, "activations");
  options.activation_checkpointing = true;
  DRAY_ASSERT_OK_AND_ASSIGN(MemoryPlan lora_plan, PlanMemory(lora, options));
  verdict = Verdict(lora_plan, k24GiB);
  EXPECT_TRUE(verdict.fits) << verdict.reason;
  EXPECT_EQ(verdict.dominant, "buffers");  // T5-XXL, resident
  options.text_encoders = Placement::kPreEncoded;
  DRAY_ASSERT_OK_AND_ASSIGN(MemoryPlan pre_encoded, PlanMemory(lora, options));
  // T5-XXL and CLIP-L in bfloat16, and the allocator's 10% of them.
  EXPECT_NEAR(lora_plan.total - pre_encoded.total, 1.1 * 2 * (4762310656 + 123060480), 2);
  DRAY_ASSERT_OK_AND_ASSIGN(MemoryPlan full_plan, PlanMemory(full, options));
  verdict = Verdict(full_plan, k24GiB);
  EXPECT_FALSE(verdict.fits);
  EXPECT_EQ(verdict.dominant, "optimizer");
  EXPECT_THAT(verdict.reason, HasSubstr("does not fit"));
}

TEST(MemoryPlanTest, BadOptionsNameTheirFlag) {
  DRAY_ASSERT_OK_AND_ASSIGN(PlanModel model, LoadPlanModel("flux-tiny", {}));
  PlanOptions options = FourRanks(ShardingStrategy::kNoShard);
  EXPECT_THAT(PlanMemory(model, options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--strategy NO_SHARD (worker.image_edit.fsdp_sharding_strategy) "
                                 "cannot go with --dtype bfloat16")));
  options.dtype = at::kFloat;
  DRAY_EXPECT_OK(PlanMemory(model, options).status());
  options = FourRanks();
  options.height = 1000;
  EXPECT_THAT(PlanMemory(model, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--resolution")));
  options = FourRanks(ShardingStrategy::kHybridShard);
  options.shard_group_size = 3;
  EXPECT_THAT(PlanMemory(model, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--shard-group-size")));
  options = FourRanks();
  options.libtorch = LibTorch::k1_13;
  EXPECT_THAT(PlanMemory(model, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--attention fused")));
  options = FourRanks();
  options.world_size = 0;
  EXPECT_THAT(PlanMemory(model, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--world-size")));
}

}  // namespace
}  // namespace dray
