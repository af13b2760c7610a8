#include "workers/bench/sharding_bench.h"

#include <ATen/ATen.h>

#include <memory>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adamw.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/cpu_threads.h"
#include "base/status_macros.h"
#include "runtime/collectives/local_group.h"
#include "runtime/sharding/fully_sharded.h"
#include "workers/models/layers.h"
#include "workers/models/qwen_image/model.h"

namespace dray {
namespace {

using qwen_image::QwenImageTransformer;
using qwen_image::SampleImages;

// Model: the small preset with more blocks, so that blocks dominate as in the real model.
QwenImageTransformer Model(int64_t layers) {
  qwen_image::TransformerConfig config = qwen_image::PresetNamed("small").value().transformer;
  config.num_layers = layers;
  QwenImageTransformer model(config, at::TensorOptions().dtype(at::kFloat));
  InitializeLikePyTorch(*model, at::make_generator<at::CPUGeneratorImpl>(0));
  return model;
}

// Step runs one training step on a 2-sample batch of 16x16-token images.
absl::Status Step(QwenImageTransformer& model, torch::optim::Optimizer& optimizer) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(1);
  optimizer.zero_grad();
  DRAY_ASSIGN_OR_RETURN(
      at::Tensor out,
      model->forward(at::randn({2, 512, 64}, generator), at::randn({2, 16, 48}, generator), {},
                     at::rand({2}, generator),
                     std::vector<SampleImages>(2, {{1, 16, 16}, {1, 16, 16}})));
  out.pow(2).mean().backward();
  optimizer.step();
  return absl::OkStatus();
}

int64_t OptimizerBytes(torch::optim::AdamW& optimizer) {
  int64_t bytes = 0;
  for (const auto& entry : optimizer.state()) {
    const auto& state = static_cast<const torch::optim::AdamWParamState&>(*entry.second);
    bytes += state.exp_avg().nbytes() + state.exp_avg_sq().nbytes();
  }
  return bytes;
}

// TrainedShards: Model(layers) FULL_SHARD on `comm`'s ranks with AdamW
// over its shards (declared in destruction order: the optimizer, then
// the shards, then the model their hooks run in).
struct TrainedShards {
  QwenImageTransformer model{nullptr};
  std::unique_ptr<FullyShardedModule> sharded;
  std::unique_ptr<torch::optim::AdamW> optimizer;
};
absl::StatusOr<TrainedShards> ShardForTraining(int64_t layers, Communicator* comm) {
  TrainedShards out;
  out.model = Model(layers);
  std::vector<std::shared_ptr<torch::nn::Module>> units(out.model->blocks()->begin(),
                                                        out.model->blocks()->end());
  DRAY_ASSIGN_OR_RETURN(out.sharded, FullyShardedModule::Shard(out.model.ptr(), units, comm, {}));
  out.model->set_unit_hooks(out.sharded.get());
  out.optimizer = std::make_unique<torch::optim::AdamW>(out.sharded->shards(),
                                                        torch::optim::AdamWOptions(1e-4));
  return out;
}

// Dmd2Bytes: one rank's bytes of DMD2's three models after a step of each
// trained one: the generator and the fake score (float32 masters,
// gradients and AdamW's two moments), the real score frozen in bfloat16.
struct Dmd2Bytes {
  int64_t generator = 0, real_score = 0, fake_score = 0;
};

// TrainedBytes: a trained copy's resident bytes on this rank after a step.
absl::StatusOr<int64_t> TrainedBytes(int64_t layers, Communicator* comm) {
  DRAY_ASSIGN_OR_RETURN(TrainedShards trained, ShardForTraining(layers, comm));
  DRAY_RETURN_IF_ERROR(Step(trained.model, *trained.optimizer));
  const FullyShardedModule::Bytes bytes = trained.sharded->LocalBytes();
  return bytes.parameters + bytes.gradients + OptimizerBytes(*trained.optimizer);
}

// FrozenBytes: a frozen copy's resident bytes on this rank, stored in bfloat16.
absl::StatusOr<int64_t> FrozenBytes(int64_t layers, Communicator* comm) {
  QwenImageTransformer model = Model(layers);
  for (auto& parameter : model->parameters()) parameter.set_requires_grad(false);
  std::vector<std::shared_ptr<torch::nn::Module>> units(model->blocks()->begin(),
                                                        model->blocks()->end());
  ShardingOptions options;
  options.mixed_precision.param_dtype = at::kBFloat16;
  DRAY_ASSIGN_OR_RETURN(auto sharded, FullyShardedModule::Shard(model.ptr(), units, comm, options));
  return sharded->LocalBytes().parameters;
}

}  // namespace

absl::StatusOr<std::vector<BenchMetric>> RunShardingBench(bool quick, const BenchReporter& report) {
  UseOneCpuThreadPerCaller();  // the baseline on one core, as each rank
  const int64_t layers = quick ? 4 : 8;
  const int steps = quick ? 2 : 5;
  std::vector<BenchMetric> metrics;
  auto emit = [&](std::string name, double value, std::string unit) {
    metrics.push_back({std::move(name), value, std::move(unit)});
    if (report) report(metrics.back());
  };

  QwenImageTransformer baseline = Model(layers);
  const int64_t total_bytes = ParameterCount(*baseline) * 4;
  torch::optim::AdamW baseline_optimizer(baseline->parameters(), torch::optim::AdamWOptions(1e-4));
  DRAY_RETURN_IF_ERROR(Step(baseline, baseline_optimizer));  // warm-up
  std::vector<double> baseline_times;
  for (int i = 0; i < steps; ++i) {
    const absl::Time start = absl::Now();
    DRAY_RETURN_IF_ERROR(Step(baseline, baseline_optimizer));
    baseline_times.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  const double baseline_step = Median(baseline_times);

  for (int world : {1, 2, 4}) {
    int64_t peak = 0, grads = 0, optimizer_bytes = 0, largest = 0;
    double step = 0;
    DRAY_RETURN_IF_ERROR(RunLocalGroup(world, [&](int rank, Communicator* comm) -> absl::Status {
      UseOneCpuThreadPerCaller();
      DRAY_ASSIGN_OR_RETURN(TrainedShards trained, ShardForTraining(layers, comm));
      QwenImageTransformer& model = trained.model;
      FullyShardedModule* sharded = trained.sharded.get();
      torch::optim::AdamW& optimizer = *trained.optimizer;
      DRAY_RETURN_IF_ERROR(Step(model, optimizer));  // warm-up; optimizer state now exists
      std::vector<double> times;
      for (int i = 0; i < steps; ++i) {
        const absl::Time start = absl::Now();
        DRAY_RETURN_IF_ERROR(Step(model, optimizer));
        times.push_back(absl::ToDoubleSeconds(absl::Now() - start));
      }
      if (rank == 0) {
        peak = sharded->PeakParameterBytes();
        grads = sharded->LocalBytes().gradients;
        optimizer_bytes = OptimizerBytes(optimizer);
        largest = sharded->LargestUnitBytes();
        step = Median(times);
      }
      return absl::OkStatus();
    }));
    emit(absl::StrCat("shard_param_bytes_w", world), static_cast<double>(peak), "bytes");
    emit(absl::StrCat("shard_ideal_bytes_w", world),
         static_cast<double>(total_bytes / world + largest), "bytes");
    emit(absl::StrCat("shard_grad_bytes_w", world), static_cast<double>(grads), "bytes");
    emit(absl::StrCat("shard_optimizer_bytes_w", world), static_cast<double>(optimizer_bytes),
         "bytes");
    emit(absl::StrCat("shard_step_ratio_w", world), step / baseline_step, "x");
  }
  // DMD2's three models, each FULL_SHARD: the prediction from the parameter
  // counts (B in the blocks, which shard; R outside them, replicated) is
  // 16 (B / W + R) bytes for each trained one (float32 masters, gradients,
  // two AdamW moments) and 2 (B / W + R) for the real score.
  int64_t in_blocks = 0;
  for (const auto& block : *baseline->blocks()) in_blocks += ParameterCount(*block);
  const int64_t replicated = ParameterCount(*baseline) - in_blocks;
  for (int world : {1, 2, 4}) {
    Dmd2Bytes rank0;
    DRAY_RETURN_IF_ERROR(RunLocalGroup(world, [&](int rank, Communicator* comm) -> absl::Status {
      UseOneCpuThreadPerCaller();
      Dmd2Bytes bytes;
      DRAY_ASSIGN_OR_RETURN(bytes.generator, TrainedBytes(layers, comm));
      DRAY_ASSIGN_OR_RETURN(bytes.real_score, FrozenBytes(layers, comm));
      DRAY_ASSIGN_OR_RETURN(bytes.fake_score, TrainedBytes(layers, comm));
      if (rank == 0) rank0 = bytes;
      return absl::OkStatus();
    }));
    const double total = static_cast<double>(rank0.generator + rank0.real_score + rank0.fake_score);
    const double predicted =
        (16 + 2 + 16) * (static_cast<double>(in_blocks) / world + static_cast<double>(replicated));
    emit(absl::StrCat("dmd2_generator_bytes_w", world), static_cast<double>(rank0.generator),
         "bytes");
    emit(absl::StrCat("dmd2_real_score_bytes_w", world), static_cast<double>(rank0.real_score),
         "bytes");
    emit(absl::StrCat("dmd2_fake_score_bytes_w", world), static_cast<double>(rank0.fake_score),
         "bytes");
    emit(absl::StrCat("dmd2_predicted_bytes_w", world), predicted, "bytes");
    emit(absl::StrCat("dmd2_measured_over_predicted_w", world), total / predicted, "x");
  }
  return metrics;
}

}  // namespace dray
