#include "workers/bench/plan_bench.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <memory>
#include <vector>

#include <torch/optim/adamw.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/cpu_bfloat16.h"
#include "base/cpu_threads.h"
#include "base/libtorch_compat.h"
#include "base/status_macros.h"
#include "runtime/bench/cpu_memory_counter.h"
#include "runtime/collectives/local_group.h"
#include "runtime/sharding/fully_sharded.h"
#include "workers/models/flux/model.h"
#include "workers/models/lora.h"
#include "workers/train/plan_model.h"

namespace dray {
namespace {

using flux::FluxTransformer;
using flux::FluxTransformerInputs;

constexpr int64_t kSide = 256;       // pixels: 16 x 16 tokens per image
constexpr int64_t kTextTokens = 64;  // the text encoder's tokens
constexpr int64_t kLoraRank = 8;

LoraOptions Lora(int64_t rank) { return {rank, 2.0 * rank, flux::DiffusersLoraTargets()}; }

// Config: flux-tiny widened, so that blocks dominate as in the real model.
flux::FluxTransformerConfig Config() {
  flux::FluxTransformerConfig config = flux::FluxPresetNamed("flux-tiny").value().transformer;
  config.num_layers = 2;
  config.num_single_layers = 4;
  config.num_attention_heads = 4;
  config.attention_head_dim = 32;
  config.axes_dims_rope = {8, 12, 12};
  config.joint_attention_dim = 64;
  return config;
}

// Inputs: a micro-batch of Kontext samples: noisy then condition latent
// tokens, text.
FluxTransformerInputs Inputs(const flux::FluxTransformerConfig& config,
                             const PlanOptions& options) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(1);
  const int64_t image = 2 * (kSide / 16) * (kSide / 16), batch = options.micro_batch;
  const at::ScalarType dtype = options.dtype;
  FluxTransformerInputs in;
  in.hidden_states = at::randn({batch, image, config.in_channels}, generator).to(dtype);
  in.encoder_hidden_states =
      at::randn({batch, kTextTokens, config.joint_attention_dim}, generator).to(dtype);
  in.pooled_projections = at::randn({batch, config.pooled_projection_dim}, generator).to(dtype);
  in.timestep = at::full({batch}, 0.5);
  in.guidance = at::full({batch}, 3.5);
  in.img_ids = at::randint(0, kSide / 16, {image, 3}, generator).to(at::kFloat);
  in.txt_ids = at::zeros({kTextTokens, 3});
  return in;
}

// Trained: one rank's model, its shards and AdamW over them (declared in
// destruction order: the optimizer, the shards, the model their hooks run in).
struct Trained {
  FluxTransformer model{nullptr};
  std::unique_ptr<FullyShardedModule> sharded;
  std::unique_ptr<torch::optim::AdamW> optimizer;
};

absl::StatusOr<Trained> ShardForTraining(const PlanCheck& check, Communicator* comm) {
  Trained out;
  out.model = FluxTransformer(Config(), at::TensorOptions().dtype(at::kFloat));
  InitializeLikePyTorch(*out.model, at::make_generator<at::CPUGeneratorImpl>(0));
  if (check.lora_rank > 0) {
    DRAY_RETURN_IF_ERROR(AddLoraAdapters(*out.model, Lora(check.lora_rank),
                                         at::make_generator<at::CPUGeneratorImpl>(2))
                             .status());
  }
  ShardingOptions sharding;
  sharding.strategy = check.options.strategy;
  sharding.prefetch = check.options.limit_all_gathers > 1;
  sharding.limit_all_gathers = check.options.limit_all_gathers;
  if (check.options.dtype != at::kFloat) sharding.mixed_precision.param_dtype = check.options.dtype;
  DRAY_ASSIGN_OR_RETURN(
      out.sharded, FullyShardedModule::Shard(out.model.ptr(), out.model->blocks(), comm, sharding));
  out.model->set_unit_hooks(out.sharded.get());
  out.model->set_activation_checkpointing(check.options.activation_checkpointing);
  out.optimizer = std::make_unique<torch::optim::AdamW>(out.sharded->shards(),
                                                        torch::optim::AdamWOptions(1e-4));
  return out;
}

// Step: forward, backward, clipping, AdamW, as the trainer steps.
absl::Status Step(Trained& trained, const FluxTransformerInputs& inputs) {
  trained.optimizer->zero_grad();
  DRAY_ASSIGN_OR_RETURN(at::Tensor out, trained.model->forward(inputs));
  out.pow(2).mean().backward();
  DRAY_RETURN_IF_ERROR(trained.sharded->ClipGradNorm(1.0).status());
  trained.optimizer->step();
  return absl::OkStatus();
}

// Measure: the largest rank's peak in the second step (AdamW's state and
// the kept gradients exist), counting from before the ranks started.
absl::StatusOr<int64_t> Measure(const PlanCheck& check) {
  CpuMemoryCounter& counter = InstallCpuMemoryCounter();
  const int world = check.options.world_size;
  counter.SplitIntoRanks(world);
  std::vector<int64_t> peaks(world);
  DRAY_RETURN_IF_ERROR(RunLocalGroup(world, [&](int rank, Communicator* comm) -> absl::Status {
    CpuMemoryCounter::CountThisThreadAsRank(rank);
    UseOneCpuThreadPerCaller();
    DRAY_ASSIGN_OR_RETURN(Trained trained, ShardForTraining(check, comm));
    const FluxTransformerInputs inputs = Inputs(Config(), check.options);
    DRAY_RETURN_IF_ERROR(Step(trained, inputs));
    DRAY_RETURN_IF_ERROR(comm->Barrier());
    if (rank == 0) counter.ResetPeak();
    DRAY_RETURN_IF_ERROR(comm->Barrier());
    DRAY_RETURN_IF_ERROR(Step(trained, inputs));
    peaks[rank] = counter.RankPeak(rank);
    return absl::OkStatus();
  }));
  return *std::max_element(peaks.begin(), peaks.end());
}

absl::StatusOr<int64_t> Predict(const PlanCheck& check) {
  FluxTransformer shapes(Config(), at::TensorOptions().dtype(at::kFloat).device(at::kMeta));
  if (check.lora_rank > 0) {
    DRAY_RETURN_IF_ERROR(
        AddLoraAdapters(*shapes, Lora(check.lora_rank), at::make_generator<at::CPUGeneratorImpl>(2))
            .status());
  }
  DRAY_ASSIGN_OR_RETURN(
      MemoryPlan plan,
      PlanMemory(CountFluxTransformer("flux-tiny widened", *shapes), check.options));
  return plan.total;
}

// Case: one setup; `micro_batch` and `limit_all_gathers` other than 1
// name themselves ("_mb2", "_prefetch").
PlanCheck Case(int world, ShardingStrategy strategy, bool lora, bool checkpointing,
               at::ScalarType dtype, int64_t micro_batch = 1, int limit_all_gathers = 1) {
  PlanCheck check;
  check.lora_rank = lora ? kLoraRank : 0;
  PlanOptions& o = check.options;
  o.world_size = world;
  o.strategy = strategy;
  o.dtype = dtype;
  o.activation_checkpointing = checkpointing;
  o.micro_batch = micro_batch;
  o.limit_all_gathers = limit_all_gathers;
  o.height = o.width = kSide;
  o.text_tokens = kTextTokens;
  o.libtorch = kLibTorch2 ? LibTorch::k2 : LibTorch::k1_13;  // this build's
  o.attention = AttentionKernelScope::current();             // 1.13: blockwise; 2: fused
  o.collectives = Collectives::kGloo;
  o.allocator_overhead = 0;  // the counter sees exact requests
  o.context_bytes = 0;
  check.name = absl::StrCat("w", world, "_", absl::AsciiStrToLower(ShardingStrategyName(strategy)),
                            lora ? "_lora" : "_full", checkpointing ? "_ckpt" : "",
                            micro_batch > 1 ? absl::StrCat("_mb", micro_batch) : "",
                            limit_all_gathers > 1 ? "_prefetch" : "",
                            dtype == at::kFloat ? "_f32" : "_bf16");
  return check;
}

std::vector<PlanCheck> Cases(bool quick) {
  const at::ScalarType dtype = CpuBfloat16Support().ok() ? at::kBFloat16 : at::kFloat;
  std::vector<PlanCheck> cases;
  for (int world : {1, 2}) {
    for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp})
      for (bool lora : {true, false})
        for (bool checkpointing : {false, true})
          cases.push_back(Case(world, strategy, lora, checkpointing, dtype));
  }
  if (quick) return cases;
  for (bool checkpointing : {false, true})
    cases.push_back(Case(2, ShardingStrategy::kFullShard, false, checkpointing, at::kFloat));
  cases.push_back(Case(2, ShardingStrategy::kShardGradOp, true, false, at::kFloat));
  cases.push_back(Case(2, ShardingStrategy::kNoShard, false, false, at::kFloat));
  cases.push_back(Case(2, ShardingStrategy::kFullShard, false, false, dtype, /*micro_batch=*/2));
  cases.push_back(Case(2, ShardingStrategy::kFullShard, false, false, dtype, 1,
                       /*limit_all_gathers=*/2));
  return cases;
}

}  // namespace

absl::StatusOr<std::vector<PlanCheck>> RunPlanChecks(
    bool quick, const std::function<void(const PlanCheck&)>& done) {
  InstallCpuMemoryCounter();  // before anything the cases measure is allocated
  std::vector<PlanCheck> checks = Cases(quick);
  for (PlanCheck& check : checks) {
    DRAY_ASSIGN_OR_RETURN(check.predicted, Predict(check));
    DRAY_ASSIGN_OR_RETURN(check.measured, Measure(check));
    if (done) done(check);
  }
  return checks;
}

absl::StatusOr<std::vector<BenchMetric>> RunPlanBench(bool quick, const BenchReporter& report) {
  std::vector<BenchMetric> metrics;
  auto emit = [&](std::string name, double value, std::string unit) {
    metrics.push_back({std::move(name), value, std::move(unit)});
    if (report) report(metrics.back());
  };
  const double mib = 1 << 20;
  DRAY_RETURN_IF_ERROR(
      RunPlanChecks(quick, [&](const PlanCheck& check) {
        emit(absl::StrCat("plan_ratio_", check.name), check.ratio(), "x");
        emit(absl::StrCat("plan_measured_", check.name), check.measured / mib, "MiB");
        emit(absl::StrCat("plan_predicted_", check.name), check.predicted / mib, "MiB");
      }).status());
  return metrics;
}

}  // namespace dray
