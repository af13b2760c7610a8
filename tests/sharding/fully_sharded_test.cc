// FullyShardedModule against an unsharded single-process reference: real
// Gloo process groups, one thread per rank, world sizes 1-4 with parameter
// counts that do not divide by them. Forward outputs, reduce-scattered
// gradients and parameters after AdamW steps agree within 1e-6 (float32).
#include "runtime/sharding/fully_sharded.h"

#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/collectives/local_group.h"
#include "runtime/sharding/activation_checkpoint.h"
#include "runtime/sharding/optimizer_state.h"
#include "workers/models/layers.h"
#include "workers/models/lora.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;

constexpr int64_t kWidth = 5;   // block parameters: 5*15+15 + 15*5+5 = 170
constexpr int64_t kBatch = 12;  // divides by 1, 2, 3, 4
constexpr int kSteps = 3;

class BlockImpl : public torch::nn::Module {
 public:
  // `spare`: a layer the block never uses (its parameters get no gradient).
  explicit BlockImpl(bool spare = false) {
    fc1 = register_module("fc1", Linear(LinearImpl::Options{kWidth, 3 * kWidth}));
    fc2 = register_module("fc2", Linear(LinearImpl::Options{3 * kWidth, kWidth}));
    if (spare) register_module("spare", Linear(LinearImpl::Options{kWidth, kWidth}));
  }
  at::Tensor forward(const at::Tensor& x) { return x + fc2->forward(at::tanh(fc1->forward(x))); }
  Linear fc1{nullptr}, fc2{nullptr};
};

// ToyModel: input projection, 3 residual blocks (the units), output projection.
class ToyModelImpl : public torch::nn::Module {
 public:
  explicit ToyModelImpl(uint64_t seed = 0, bool spare = false) {
    input = register_module("input", Linear(LinearImpl::Options{3, kWidth}));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < 3; ++i) blocks->push_back(std::make_shared<BlockImpl>(spare));
    output = register_module("output", Linear(LinearImpl::Options{kWidth, 2}));
    InitializeLikePyTorch(*this, at::make_generator<at::CPUGeneratorImpl>(seed));
  }
  at::Tensor forward(const at::Tensor& x, UnitHooks* hooks, bool checkpoint = false) {
    if (hooks) hooks->BeforeForward();
    at::Tensor h =
        input->forward(x.to(input->weight.scalar_type()));  // compute in the parameters' dtype
    for (size_t i = 0; i < blocks->size(); ++i) {
      if (hooks) hooks->BeforeUnit(i);
      BlockImpl* block = blocks[i]->as<BlockImpl>();
      h = checkpoint ? CheckpointedForward(
                           [block](const std::vector<at::Tensor>& in) {
                             return std::vector<at::Tensor>{block->forward(in[0])};
                           },
                           {h})[0]
                     : block->forward(h);
      if (hooks) hooks->AfterUnit(i, {h});
    }
    return AtLeastFloat32(output->forward(h));
  }
  std::vector<std::shared_ptr<torch::nn::Module>> units() {
    std::vector<std::shared_ptr<torch::nn::Module>> units(blocks->begin(), blocks->end());
    return units;
  }
  Linear input{nullptr}, output{nullptr};
  torch::nn::ModuleList blocks{nullptr};
};
TORCH_MODULE(ToyModel);

struct Data {
  at::Tensor x, y;
};

Data MakeData() {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(1);
  return {at::randn({kBatch, 3}, generator), at::randn({kBatch, 2}, generator)};
}

// Trace: what a run produced, to compare.
struct Trace {
  at::Tensor first_output;                       // this rank's rows, step 0
  std::map<std::string, at::Tensor> first_grad;  // reference: per parameter, step 0
  std::vector<at::Tensor> shard_grads;           // sharded: per unit shard, step 0
  std::map<std::string, at::Tensor> final_params;
};

torch::optim::AdamWOptions Adam() { return torch::optim::AdamWOptions(0.05).weight_decay(0.01); }

// RunReference trains the whole model in `dtype` on one rank.
Trace RunReference(const Data& data, at::ScalarType dtype = at::kFloat) {
  ToyModel model;
  model->to(dtype);
  torch::optim::AdamW optimizer(model->parameters(), Adam());
  Trace trace;
  for (int step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    const at::Tensor out = model->forward(data.x, nullptr);
    (out - data.y).pow(2).mean().backward();
    if (step == 0) {
      trace.first_output = out.detach();
      for (const auto& p : model->named_parameters())
        trace.first_grad[p.key()] = p.value().grad().clone();
    }
    optimizer.step();
  }
  for (const auto& p : model->named_parameters())
    trace.final_params[p.key()] = p.value().detach().clone();
  return trace;
}

// RunInGroup runs `body` on `world` Gloo ranks (threads), failing the test on errors.
void RunInGroup(int world, const std::function<void(int, Communicator*)>& body) {
  at::set_num_threads(1);
  DRAY_ASSERT_OK(RunLocalGroup(world, [&](int rank, Communicator* comm) {
    body(rank, comm);
    return absl::OkStatus();
  }));
}

Trace RunRank(int rank, int world, Communicator* comm, ShardingStrategy strategy,
              const Data& data) {
  ToyModel model;
  ShardingOptions options;
  options.strategy = strategy;
  options.shard_group_size = world / 2;  // hybrid: two groups (world 4: 2 x 2, world 2: 2 x 1)
  auto sharded = FullyShardedModule::Shard(model.ptr(), model->units(), comm, options).value();
  torch::optim::AdamW optimizer(sharded->shards(), Adam());
  const int64_t rows = kBatch / world;
  const at::Tensor x = data.x.slice(0, rank * rows, (rank + 1) * rows);
  const at::Tensor y = data.y.slice(0, rank * rows, (rank + 1) * rows);
  Trace trace;
  for (int step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    const at::Tensor out = model->forward(x, sharded.get());
    (out - y).pow(2).mean().backward();
    if (step == 0) {
      trace.first_output = out.detach();
      for (const at::Tensor& shard : sharded->shards())
        trace.shard_grads.push_back(shard.grad().clone());
    }
    optimizer.step();
  }
  const auto parameters = sharded->FullParameters().value();
  for (const auto& [name, tensor] : parameters) trace.final_params[name] = tensor;
  return trace;
}

double MaxDiff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  return a.numel() == 0 ? 0 : (a - b).abs().max().item<double>();
}

class FullyShardedTest : public ::testing::TestWithParam<std::tuple<int, ShardingStrategy>> {};

TEST_P(FullyShardedTest, MatchesUnshardedTraining) {
  const auto [world, strategy] = GetParam();
  const Data data = MakeData();
  const Trace reference = RunReference(data);
  std::vector<Trace> traces(world);
  RunInGroup(world, [&](int rank, Communicator* comm) {
    traces[rank] = RunRank(rank, world, comm, strategy, data);
  });

  const int64_t rows = kBatch / world;
  ToyModel layout;
  const auto units = layout->units();
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    EXPECT_LE(MaxDiff(traces[rank].first_output,
                      reference.first_output.slice(0, rank * rows, (rank + 1) * rows)),
              1e-6);
    // Each unit's shard gradient is this rank's slice of the flat reference gradient.
    for (size_t u = 0; u < units.size(); ++u) {
      std::vector<at::Tensor> parts;
      for (const auto& p : units[u]->named_parameters()) {
        parts.push_back(
            reference.first_grad.at(absl::StrCat("blocks.", u, ".", p.key())).reshape(-1));
      }
      at::Tensor flat = at::cat(parts);
      const at::Tensor& shard = traces[rank].shard_grads[u];
      const bool hybrid = strategy == ShardingStrategy::kHybridShard ||
                          strategy == ShardingStrategy::kHybridShardZero2;
      const int64_t group = strategy == ShardingStrategy::kNoShard ? 1 : hybrid ? world / 2 : world;
      flat = at::constant_pad_nd(flat, {0, shard.numel() * group - flat.numel()}, 0);
      const int64_t start =
          strategy == ShardingStrategy::kNoShard ? 0 : (rank % group) * shard.numel();
      EXPECT_LE(MaxDiff(shard, flat.slice(0, start, start + shard.numel())), 1e-6) << "unit " << u;
    }
    ASSERT_EQ(traces[rank].final_params.size(), reference.final_params.size());
    for (const auto& [name, tensor] : reference.final_params) {
      EXPECT_LE(MaxDiff(traces[rank].final_params.at(name), tensor), 1e-6) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, FullyShardedTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::Values(ShardingStrategy::kFullShard,
                                         ShardingStrategy::kShardGradOp,
                                         ShardingStrategy::kNoShard)),
    [](const ::testing::TestParamInfo<std::tuple<int, ShardingStrategy>>& info) {
      return absl::StrCat("w", std::get<0>(info.param), "_",
                          std::string(ShardingStrategyName(std::get<1>(info.param))));
    });

// Hybrid strategies: full sharding inside each of two groups, replicas across them.
INSTANTIATE_TEST_SUITE_P(
    Hybrid, FullyShardedTest,
    ::testing::Combine(::testing::Values(2, 4),
                       ::testing::Values(ShardingStrategy::kHybridShard,
                                         ShardingStrategy::kHybridShardZero2)),
    [](const ::testing::TestParamInfo<std::tuple<int, ShardingStrategy>>& info) {
      return absl::StrCat("w", std::get<0>(info.param), "_",
                          std::string(ShardingStrategyName(std::get<1>(info.param))));
    });

// Frozen parameters (LoRA): only the adapters train, sharded or not; the
// frozen base, sharded apart, gets no gradient and weight decay never moves it.
std::map<std::string, at::Tensor> TrainLora(Communicator* comm, ShardingStrategy strategy,
                                            const Data& data) {
  ToyModel model;
  const LoraOptions lora{2, 4, {"fc1", "fc2"}};
  EXPECT_TRUE(AddLoraAdapters(*model, lora, at::make_generator<at::CPUGeneratorImpl>(9)).ok());
  std::unique_ptr<FullyShardedModule> sharded;
  std::vector<at::Tensor> trained;
  for (const auto& p : model->parameters()) {
    if (p.requires_grad()) trained.push_back(p);
  }
  if (comm != nullptr) {
    ShardingOptions options;
    options.strategy = strategy;
    sharded = FullyShardedModule::Shard(model.ptr(), model->units(), comm, options).value();
    trained = sharded->shards();
  }
  torch::optim::AdamW optimizer(trained, Adam());
  const int world = comm == nullptr ? 1 : comm->world_size();
  const int rank = comm == nullptr ? 0 : comm->rank();
  const int64_t rows = kBatch / world;
  for (int step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    const at::Tensor out =
        model->forward(data.x.slice(0, rank * rows, (rank + 1) * rows), sharded.get());
    (out - data.y.slice(0, rank * rows, (rank + 1) * rows)).pow(2).mean().backward();
    optimizer.step();
  }
  std::map<std::string, at::Tensor> params;
  if (sharded == nullptr) {
    for (const auto& p : model->named_parameters()) params[p.key()] = p.value().detach().clone();
  } else {
    const auto full = sharded->FullParameters().value();
    for (const auto& [name, tensor] : full) params[name] = tensor;
  }
  return params;
}

TEST(FullyShardedFrozenTest, LoraAdaptersTrainAloneAndMatchUnsharded) {
  const Data data = MakeData();
  const std::map<std::string, at::Tensor> reference =
      TrainLora(nullptr, ShardingStrategy::kFullShard, data);
  ToyModel untouched;
  for (const auto& p : untouched->named_parameters()) {
    EXPECT_TRUE(at::equal(reference.at(p.key()), p.value())) << p.key() << " is frozen";
  }
  EXPECT_GT(MaxDiff(reference.at("blocks.0.fc1.lora_B.weight"), at::zeros({15, 2})), 1e-3);
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp}) {
    for (int world : {2, 3}) {
      std::vector<std::map<std::string, at::Tensor>> trained(world);
      RunInGroup(world, [&](int rank, Communicator* comm) {
        trained[rank] = TrainLora(comm, strategy, data);
      });
      for (const auto& [name, tensor] : reference) {
        SCOPED_TRACE(absl::StrCat(ShardingStrategyName(strategy), " at world ", world, ": ", name));
        EXPECT_LE(MaxDiff(trained[0].at(name), tensor), 1e-6);
        if (name.find("lora_") == std::string::npos) {
          EXPECT_TRUE(at::equal(trained[0].at(name), tensor));
        }
      }
    }
  }
}

// True CFG runs the model twice (conditional and negative input) before one
// backward: every unit is used by two graphs whose backward passes
// interleave, and, as in the transformer's last block, some parameters get
// no gradient at all. Gradients must equal unsharded ones.
// TwoForwardGradients returns the trainable parameters' gradients in
// parameter order, unsharded, or each unit's shard gradient ("unitN").
std::vector<std::pair<std::string, at::Tensor>> TwoForwardGradients(Communicator* comm,
                                                                    ShardingStrategy strategy,
                                                                    const Data& data, bool lora) {
  ToyModel model(/*seed=*/0, /*spare=*/true);
  if (lora) {  // adapters with B drawn too, so that every adapter weight gets a gradient
    EXPECT_TRUE(
        AddLoraAdapters(*model, {2, 4, {"fc1", "fc2"}}, at::make_generator<at::CPUGeneratorImpl>(9))
            .ok());
    torch::NoGradGuard no_grad;
    for (auto& [name, tensor] : LoraState(*model))
      tensor.normal_(0, 0.3, at::make_generator<at::CPUGeneratorImpl>(name.size()));
  }
  std::unique_ptr<FullyShardedModule> sharded;
  if (comm != nullptr) {
    ShardingOptions options;
    options.strategy = strategy;
    sharded = FullyShardedModule::Shard(model.ptr(), model->units(), comm, options).value();
  }
  for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {  // gradients accumulate
    const at::Tensor x = data.x.narrow(0, micro_batch * 6, 6);
    const at::Tensor first = model->forward(x, sharded.get());
    const at::Tensor second = model->forward(x.flip(0) * 0.5, sharded.get());
    (first * 3 - second).pow(2).mean().backward();
  }
  std::vector<std::pair<std::string, at::Tensor>> gradients;
  if (sharded == nullptr) {
    for (const auto& p : model->named_parameters()) {
      if (!p.value().requires_grad()) continue;
      const at::Tensor& grad = p.value().grad();  // none for the spare layer
      gradients.emplace_back(p.key(), grad.defined() ? grad.clone() : at::zeros_like(p.value()));
    }
    return gradients;
  }
  // At world 1 each unit's shard is its whole flat parameter.
  const std::vector<at::Tensor> shards = sharded->shards();
  for (size_t u = 0; u < 3; ++u)
    gradients.emplace_back(absl::StrCat("unit", u), shards[u].grad().clone());
  return gradients;
}

TEST(FullyShardedGradientTest, TwoForwardsBeforeOneBackwardGiveUnshardedGradients) {
  const Data data = MakeData();
  for (bool lora : {false, true}) {
    const auto reference = TwoForwardGradients(nullptr, ShardingStrategy::kFullShard, data, lora);
    for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                      ShardingStrategy::kNoShard}) {
      std::vector<std::pair<std::string, at::Tensor>> sharded;
      RunInGroup(1, [&](int, Communicator* comm) {
        sharded = TwoForwardGradients(comm, strategy, data, lora);
      });
      for (size_t u = 0; u < 3; ++u) {
        std::vector<at::Tensor> parts;
        for (const auto& [name, gradient] : reference) {
          if (name.rfind(absl::StrCat("blocks.", u, "."), 0) == 0)
            parts.push_back(gradient.reshape(-1));
        }
        EXPECT_LE(MaxDiff(sharded.at(u).second, at::cat(parts)), 1e-6)
            << ShardingStrategyName(strategy) << (lora ? " with LoRA" : "") << ", unit " << u;
      }
    }
  }
}

// A worker shards several modules over one communicator (the transformer and
// the text encoder): the hybrid strategies' subgroups of each stay apart.
TEST(FullyShardedTest, TwoModulesShardHybridOverOneCommunicator) {
  const Data data = MakeData();
  const at::Tensor expected = ToyModel()->forward(data.x, nullptr);
  RunInGroup(2, [&](int, Communicator* comm) {
    ShardingOptions options;
    options.strategy = ShardingStrategy::kHybridShard;
    options.shard_group_size = 2;
    ToyModel first, second;
    auto first_sharded = FullyShardedModule::Shard(first.ptr(), first->units(), comm, options);
    auto second_sharded = FullyShardedModule::Shard(second.ptr(), second->units(), comm, options);
    ASSERT_TRUE(first_sharded.ok()) << first_sharded.status();
    ASSERT_TRUE(second_sharded.ok()) << second_sharded.status();
    EXPECT_LE(MaxDiff(second->forward(data.x, second_sharded->get()), expected), 1e-6);
    EXPECT_LE(MaxDiff(first->forward(data.x, first_sharded->get()), expected), 1e-6);
  });
}

TEST(WrapPolicyTest, TransformerAndSizeBasedUnits) {
  ToyModel model;
  const auto blocks = UnitsOfType<BlockImpl>(*model);
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[1].get(), model->blocks[1].get());
  const auto groups = SizeBasedWrap(blocks, /*min_num_params=*/300);  // 170 per block: 2 + 1
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].size(), 2u);
  EXPECT_EQ(groups[1].size(), 1u);

  const Data data = MakeData();
  const Trace reference = RunReference(data);
  RunInGroup(2, [&](int rank, Communicator* comm) {
    ToyModel sharded_model;
    auto sharded = FullyShardedModule::Shard(sharded_model.ptr(),
                                             SizeBasedWrap(sharded_model->units(), 300), comm, {})
                       .value();
    torch::optim::AdamW optimizer(sharded->shards(), Adam());
    const at::Tensor x = data.x.slice(0, rank * 6, rank * 6 + 6),
                     y = data.y.slice(0, rank * 6, rank * 6 + 6);
    for (int step = 0; step < kSteps; ++step) {
      optimizer.zero_grad();
      (sharded_model->forward(x, sharded.get()) - y).pow(2).mean().backward();
      optimizer.step();
    }
    EXPECT_EQ(sharded->LargestUnitBytes(), 340 * 4);
    EXPECT_EQ(sharded->PeakParameterBytes() - sharded->LocalBytes().parameters,
              340 * 4);  // one unit at a time
    const auto gathered = sharded->FullParameters().value();
    for (const auto& [name, tensor] : gathered)
      EXPECT_LE(MaxDiff(tensor, reference.final_params.at(name)), 1e-6) << name;
  });
}

TEST(FullyShardedMemoryTest, UnitsAreGatheredOnlyWhileNeeded) {
  const Data data = MakeData();
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp}) {
    RunInGroup(2, [&](int rank, Communicator* comm) {
      ToyModel model;
      auto sharded =
          FullyShardedModule::Shard(model.ptr(), model->units(), comm, {strategy}).value();
      // Each unit: 170 parameters, padded to 170 = 2 x 85 float32 on each rank.
      const int64_t replicated = (3 * kWidth + kWidth) + (kWidth * 2 + 2);
      const int64_t resident = (3 * 85 + replicated) * 4;
      EXPECT_EQ(sharded->LocalBytes().parameters, resident);
      const at::Tensor out = model->forward(data.x.slice(0, rank * 6, rank * 6 + 6), sharded.get());
      // FULL_SHARD frees every unit after its forward; SHARD_GRAD_OP keeps them for backward.
      const int64_t gathered = strategy == ShardingStrategy::kFullShard ? 0 : 3 * 170 * 4;
      EXPECT_EQ(sharded->LocalBytes().parameters, resident + gathered)
          << ShardingStrategyName(strategy);
      out.pow(2).mean().backward();
      const FullyShardedModule::Bytes after = sharded->LocalBytes();
      EXPECT_EQ(after.parameters, resident);
      EXPECT_EQ(after.gradients,
                resident);  // shard and replicated gradients only, no full ones left
      // The memory bound: shards, replicated parameters and at most one gathered
      // unit at any moment (FULL_SHARD), or all units between forward and backward.
      const int64_t bound =
          resident + (strategy == ShardingStrategy::kFullShard ? 170 * 4 : 3 * 170 * 4);
      EXPECT_EQ(sharded->PeakParameterBytes(), bound);
    });
  }
}

TEST(FullyShardedMemoryTest, PrefetchHoldsAtMostTheLimitAndChangesNothing) {
  const Data data = MakeData();
  std::vector<at::Tensor> plain(2), prefetched(2);
  std::vector<int64_t> peaks(2);
  RunInGroup(2, [&](int rank, Communicator* comm) {
    const at::Tensor x = data.x.slice(0, rank * 6, rank * 6 + 6);
    for (bool prefetch : {false, true}) {
      ToyModel model;
      ShardingOptions options;
      options.prefetch = prefetch;
      options.limit_all_gathers = 2;
      auto sharded = FullyShardedModule::Shard(model.ptr(), model->units(), comm, options).value();
      model->forward(x, sharded.get()).pow(2).mean().backward();
      (prefetch ? prefetched : plain)[rank] = sharded->shards()[0].grad().clone();
      if (prefetch) peaks[rank] = sharded->PeakParameterBytes() - sharded->LocalBytes().parameters;
    }
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(at::equal(prefetched[rank], plain[rank]));
    EXPECT_EQ(peaks[rank], 2 * 170 * 4);  // two gathered units at most: the current and the next
  }
}

TEST(FullyShardedPrecisionTest, BFloat16ComputeWithFloat32MastersTracksFloat32Training) {
  const Data data = MakeData();
  const Trace reference = RunReference(data);
  RunInGroup(2, [&](int rank, Communicator* comm) {
    ToyModel model;
    ShardingOptions options;
    options.mixed_precision.param_dtype = at::kBFloat16;
    options.mixed_precision.reduce_dtype = at::kFloat;
    auto sharded = FullyShardedModule::Shard(model.ptr(), model->units(), comm, options).value();
    EXPECT_EQ(sharded->DescribePrecision(),
              "trainable parameters stored as float32 shards, frozen ones in bfloat16, gathered "
              "and computed in bfloat16, gradients reduced in float32");
    EXPECT_EQ(model->blocks[0]->as<BlockImpl>()->fc1->weight.scalar_type(), at::kBFloat16);
    EXPECT_EQ(model->input->weight.scalar_type(), at::kBFloat16);
    for (const at::Tensor& master : sharded->shards()) EXPECT_EQ(master.scalar_type(), at::kFloat);
    torch::optim::AdamW optimizer(sharded->shards(), Adam());
    const at::Tensor x = data.x.slice(0, rank * 6, rank * 6 + 6),
                     y = data.y.slice(0, rank * 6, rank * 6 + 6);
    for (int step = 0; step < kSteps; ++step) {
      optimizer.zero_grad();
      const at::Tensor out = model->forward(x, sharded.get());
      (out - y).pow(2).mean().backward();
      if (step == 0) {
        EXPECT_LE(MaxDiff(out, reference.first_output.slice(0, rank * 6, rank * 6 + 6)), 5e-2);
        // Block 0's gradient shard, within bfloat16's relative error of the float32 one.
        std::vector<at::Tensor> parts;
        for (const auto& p : model->units()[0]->named_parameters()) {
          parts.push_back(reference.first_grad.at("blocks.0." + p.key()).reshape(-1));
        }
        const at::Tensor flat = at::constant_pad_nd(at::cat(parts), {0, 2 * 85 - 170}, 0);
        const at::Tensor expected = flat.slice(0, rank * 85, rank * 85 + 85);
        EXPECT_LE(MaxDiff(sharded->shards()[0].grad(), expected),
                  2e-2 * expected.abs().max().item<double>() + 1e-4);
      }
      optimizer.step();
    }
    // float32 masters after bfloat16 steps stay close to float32 training on
    // average (Adam moves a weight by ~lr whatever its gradient's size, so a
    // near-zero gradient whose sign bfloat16 flips differs by 2 lr there).
    const auto gathered = sharded->FullParameters().value();
    for (const auto& [name, tensor] : gathered) {
      EXPECT_EQ(tensor.scalar_type(), at::kFloat);
      EXPECT_LE((tensor - reference.final_params.at(name)).abs().mean().item<double>(), 1e-2)
          << name;
    }
  });
}

// A float64 module (torch_dtype float64: runs compared at float64's
// precision) keeps float64 masters and reduces in float64.
TEST(FullyShardedPrecisionTest, AFloat64ModuleKeepsFloat64MastersAndReductions) {
  const Data data = MakeData();
  const Trace reference = RunReference(data, at::kDouble);
  RunInGroup(2, [&](int rank, Communicator* comm) {
    ToyModel model;
    model->to(at::kDouble);
    auto sharded = FullyShardedModule::Shard(model.ptr(), model->units(), comm, {}).value();
    EXPECT_EQ(sharded->DescribePrecision(),
              "trainable parameters stored as float64 shards, frozen ones in float64, gathered "
              "and computed in float64, gradients reduced in float64");
    for (const at::Tensor& master : sharded->shards()) EXPECT_EQ(master.scalar_type(), at::kDouble);
    torch::optim::AdamW optimizer(sharded->shards(), Adam());
    const at::Tensor x = data.x.slice(0, rank * 6, rank * 6 + 6).to(at::kDouble),
                     y = data.y.slice(0, rank * 6, rank * 6 + 6).to(at::kDouble);
    for (int step = 0; step < kSteps; ++step) {
      optimizer.zero_grad();
      (model->forward(x, sharded.get()) - y).pow(2).mean().backward();
      optimizer.step();
    }
    const auto parameters = sharded->FullParameters().value();
    for (const auto& [name, tensor] : parameters) {
      EXPECT_EQ(tensor.scalar_type(), at::kDouble) << name;
      EXPECT_LE(MaxDiff(tensor, reference.final_params.at(name)), 1e-12) << name;
    }
  });
}

// ShardInBfloat16: `model` sharded with bfloat16 compute over float32 masters.
std::unique_ptr<FullyShardedModule> ShardInBfloat16(ToyModel& model, Communicator* comm) {
  ShardingOptions options;
  options.mixed_precision.param_dtype = at::kBFloat16;
  return FullyShardedModule::Shard(model.ptr(), model->units(), comm, options).value();
}

// ExpectInputWeightIsItsMaster: the working copy of `input.weight` (outside
// every unit) is its float32 master rounded to bfloat16.
void ExpectInputWeightIsItsMaster(ToyModel& model, FullyShardedModule& sharded) {
  const auto masters = sharded.FullParameters().value();
  for (const auto& [name, master] : masters) {
    if (name == "input.weight") {
      EXPECT_TRUE(at::equal(model->input->weight, master.to(at::kBFloat16)));
    }
  }
}

TEST(FullyShardedPrecisionTest, TwoForwardsBeforeOneBackwardKeepTheWorkingCopies) {
  // True CFG under mixed precision: the parameters outside every unit compute
  // from bfloat16 working copies, which the first forward saved for backward;
  // the second forward must not rewrite them, and after a step they follow.
  const Data data = MakeData();
  RunInGroup(2, [&](int rank, Communicator* comm) {
    ToyModel model;
    auto sharded = ShardInBfloat16(model, comm);
    torch::optim::AdamW optimizer(sharded->shards(), Adam());
    const at::Tensor x = data.x.slice(0, rank * 6, rank * 6 + 6);
    for (int step = 0; step < 2; ++step) {
      optimizer.zero_grad();
      const at::Tensor guided =
          model->forward(x, sharded.get()) - model->forward(x * 0.5, sharded.get());
      guided.pow(2).mean().backward();
      optimizer.step();
    }
    model->forward(x, sharded.get());
    ExpectInputWeightIsItsMaster(model, *sharded);
  });
}

// torch::optim's SGD steps its parameters' data without bumping their
// versions: the working copies follow it all the same. (They once followed
// only version bumps, so a bfloat16 SGD run computed with the initial
// parameters outside every unit forever; the GPU tests found it.)
TEST(FullyShardedPrecisionTest, WorkingCopiesFollowAStepThatBumpsNoVersion) {
  const Data data = MakeData();
  RunInGroup(2, [&](int rank, Communicator* comm) {
    ToyModel model;
    auto sharded = ShardInBfloat16(model, comm);
    torch::optim::SGD optimizer(sharded->shards(), torch::optim::SGDOptions(0.5));
    const at::Tensor x = data.x.slice(0, rank * 6, rank * 6 + 6);
    model->forward(x, sharded.get()).pow(2).mean().backward();
    const at::Tensor before = model->input->weight.detach().clone();
    optimizer.step();
    model->forward(x, sharded.get());
    EXPECT_FALSE(at::equal(model->input->weight, before));
    ExpectInputWeightIsItsMaster(model, *sharded);
  });
}

TEST(FullyShardedPrecisionTest, FrozenParametersOutsideUnitsAreStoredInTheComputeDtype) {
  // A frozen parameter needs no float32 master: it is stored as computed,
  // counted once, reported in float32 and reloaded through its own copy.
  RunInGroup(2, [&](int, Communicator* comm) {
    ShardingOptions options;
    options.mixed_precision.param_dtype = at::kBFloat16;
    ToyModel trainable(/*seed=*/1), frozen(/*seed=*/1), other(/*seed=*/2);
    for (ToyModel* model : {&frozen, &other}) {
      for (auto& parameter : (*model)->input->parameters()) parameter.set_requires_grad(false);
    }
    const at::Tensor weight = frozen->input->weight.detach().clone();
    auto a = FullyShardedModule::Shard(trainable.ptr(), trainable->units(), comm, options).value();
    auto b = FullyShardedModule::Shard(frozen.ptr(), frozen->units(), comm, options).value();
    auto c = FullyShardedModule::Shard(other.ptr(), other->units(), comm, options).value();
    EXPECT_EQ(frozen->input->weight.scalar_type(), at::kBFloat16);
    const int64_t input_numel = weight.numel() + frozen->input->bias.numel();
    // Trainable: a float32 master and a bfloat16 working copy; frozen: the copy alone.
    EXPECT_EQ(a->LocalBytes().parameters - b->LocalBytes().parameters, 4 * input_numel);
    EXPECT_EQ(b->shards().size() + 2, a->shards().size());
    const auto full = b->FullParameters().value();
    for (const auto& [name, tensor] : full) {
      EXPECT_EQ(tensor.scalar_type(), at::kFloat) << name;
      if (name == "input.weight") {
        EXPECT_TRUE(at::equal(tensor, weight.to(at::kBFloat16).to(at::kFloat)));
      }
    }
    DRAY_ASSERT_OK(c->LoadLocalStateDict(b->LocalStateDict()));
    EXPECT_TRUE(at::equal(other->input->weight, frozen->input->weight));
  });
}

// On this CPU-only machine the compute device is the CPU too: these check the
// code paths and the state they leave, not a real device move.
TEST(FullyShardedOffloadTest, CpuOffloadEqualsNoOffload) {
  const Data data = MakeData();
  std::vector<at::Tensor> plain(2), offloaded(2);
  RunInGroup(2, [&](int rank, Communicator* comm) {
    const at::Tensor x = data.x.slice(0, rank * 6, rank * 6 + 6);
    for (bool cpu_offload : {false, true}) {
      ToyModel model;
      ShardingOptions options;
      options.cpu_offload = cpu_offload;
      auto sharded = FullyShardedModule::Shard(model.ptr(), model->units(), comm, options).value();
      torch::optim::AdamW optimizer(sharded->shards(), Adam());
      model->forward(x, sharded.get()).pow(2).mean().backward();
      optimizer.step();
      EXPECT_TRUE(sharded->shards()[0].device().is_cpu());
      (cpu_offload ? offloaded : plain)[rank] = sharded->shards()[0].detach().clone();
    }
  });
  for (int rank = 0; rank < 2; ++rank) EXPECT_TRUE(at::equal(offloaded[rank], plain[rank]));
}

TEST(FullyShardedOffloadTest, OffloadAndLoadBetweenCallsKeepTheModel) {
  const Data data = MakeData();
  RunInGroup(2, [&](int rank, Communicator* comm) {
    const at::Tensor x = data.x.slice(0, rank * 6, rank * 6 + 6);
    ToyModel model;
    auto sharded = FullyShardedModule::Shard(model.ptr(), model->units(), comm, {}).value();
    torch::NoGradGuard no_grad;
    const at::Tensor before = model->forward(x, sharded.get());
    const at::Tensor shard = sharded->shards()[0];
    DRAY_ASSERT_OK(sharded->Offload());
    EXPECT_TRUE(sharded->shards()[0].device().is_cpu());
    DRAY_ASSERT_OK(sharded->Load(at::kCPU));
    EXPECT_TRUE(
        sharded->shards()[0].is_same(shard));  // same tensor: an optimizer holding it stays valid
    EXPECT_TRUE(at::equal(model->forward(x, sharded.get()), before));
  });
}

std::map<std::string, at::Tensor> Parameters(FullyShardedModule& sharded) {
  const auto gathered = sharded.FullParameters().value();  // keep the result alive while iterating
  return std::map<std::string, at::Tensor>(gathered.begin(), gathered.end());
}

void ExpectIdentical(const std::map<std::string, at::Tensor>& a,
                     const std::map<std::string, at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, tensor] : a) EXPECT_TRUE(at::equal(tensor, b.at(name))) << name;
}

TEST(ActivationCheckpointTest, RecomputingGivesIdenticalGradients) {
  const Data data = MakeData();
  std::map<std::string, at::Tensor> grads[2];
  for (bool checkpoint : {false, true}) {
    ToyModel model;
    (model->forward(data.x, nullptr, checkpoint) - data.y).pow(2).mean().backward();
    for (const auto& p : model->named_parameters()) {
      grads[checkpoint][p.key()] = p.value().grad();
      ASSERT_TRUE(p.value().grad().defined()) << p.key() << (checkpoint ? " (checkpointed)" : "");
    }
  }
  ExpectIdentical(grads[1], grads[0]);
}

TEST(ActivationCheckpointTest, UnitsTrainWhenTheirInputsNeedNoGradient) {
  // A LoRA model's frozen input layer hands the first unit an input
  // without gradient; the checkpointed units must still get theirs.
  const Data data = MakeData();
  std::map<std::string, at::Tensor> grads[2];
  for (bool checkpoint : {false, true}) {
    ToyModel model;
    for (auto& p : model->input->parameters()) p.set_requires_grad(false);
    (model->forward(data.x, nullptr, checkpoint) - data.y).pow(2).mean().backward();
    for (const auto& p : model->blocks->named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << p.key() << (checkpoint ? " (checkpointed)" : "");
      grads[checkpoint][p.key()] = p.value().grad();
    }
  }
  ExpectIdentical(grads[1], grads[0]);
}

TEST(ActivationCheckpointTest, CombinesWithFullSharding) {
  const Data data = MakeData();
  std::vector<at::Tensor> plain(2), checkpointed(2);
  RunInGroup(2, [&](int rank, Communicator* comm) {
    const at::Tensor x = data.x.slice(0, rank * 6, rank * 6 + 6);
    for (bool checkpoint : {false, true}) {
      ToyModel model;
      auto sharded = FullyShardedModule::Shard(model.ptr(), model->units(), comm, {}).value();
      model->forward(x, sharded.get(), checkpoint).pow(2).mean().backward();
      (checkpoint ? checkpointed : plain)[rank] = sharded->shards()[1].grad().clone();
      EXPECT_EQ(sharded->LocalBytes().parameters,
                sharded->PeakParameterBytes() - 170 * 4);  // one unit at a time
    }
  });
  for (int rank = 0; rank < 2; ++rank) EXPECT_TRUE(at::equal(checkpointed[rank], plain[rank]));
}

TEST(FullyShardedGradientTest, AccumulationWithoutSyncEqualsOneSyncedStep) {
  const Data data = MakeData();
  std::vector<at::Tensor> synced(2), accumulated(2);
  RunInGroup(2, [&](int rank, Communicator* comm) {
    const at::Tensor x = data.x.slice(0, rank * 6, rank * 6 + 6),
                     y = data.y.slice(0, rank * 6, rank * 6 + 6);
    ToyModel one;
    auto a =
        FullyShardedModule::Shard(one.ptr(), one->units(), comm, {ShardingStrategy::kFullShard})
            .value();
    (one->forward(x, a.get()) - y).pow(2).mean().backward();
    synced[rank] = a->shards()[1].grad().clone();

    ToyModel two;  // the same 6 rows as two micro-batches of 3, averaged
    auto b =
        FullyShardedModule::Shard(two.ptr(), two->units(), comm, {ShardingStrategy::kFullShard})
            .value();
    b->set_gradient_sync(false);
    ((two->forward(x.slice(0, 0, 3), b.get()) - y.slice(0, 0, 3)).pow(2).mean() / 2).backward();
    EXPECT_FALSE(b->shards()[1].grad().defined());  // nothing communicated yet
    b->set_gradient_sync(true);
    ((two->forward(x.slice(0, 3, 6), b.get()) - y.slice(0, 3, 6)).pow(2).mean() / 2).backward();
    accumulated[rank] = b->shards()[1].grad().clone();
  });
  for (int rank = 0; rank < 2; ++rank) EXPECT_LE(MaxDiff(accumulated[rank], synced[rank]), 1e-6);
}

TEST(FullyShardedStateTest, FullAndShardedStateDictsReloadAtAnotherWorldSize) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/state";
  std::filesystem::create_directories(dir + "/sharded");
  const Data data = MakeData();
  std::map<std::string, at::Tensor> trained;
  RunInGroup(2, [&](int rank, Communicator* comm) {  // train a step, save both ways at W = 2
    ToyModel model;
    auto sharded = FullyShardedModule::Shard(model.ptr(), model->units(), comm, {}).value();
    torch::optim::AdamW optimizer(sharded->shards(), Adam());
    (model->forward(data.x.slice(0, rank * 6, rank * 6 + 6), sharded.get()) -
     data.y.slice(0, rank * 6, rank * 6 + 6))
        .pow(2)
        .mean()
        .backward();
    optimizer.step();
    DRAY_ASSERT_OK(sharded->SaveFullStateDict(dir + "/full.safetensors"));
    DRAY_ASSERT_OK(sharded->SaveShardedStateDict(dir + "/sharded"));
    const auto parameters = Parameters(*sharded);  // collective: every rank gathers
    if (rank == 0) trained = parameters;
  });
  RunInGroup(3, [&](int rank, Communicator* comm) {  // reload at W = 3, both ways
    ToyModel from_sharded(/*seed=*/7), from_full(/*seed=*/8);
    auto a = FullyShardedModule::Shard(from_sharded.ptr(), from_sharded->units(), comm, {}).value();
    DRAY_ASSERT_OK(a->LoadShardedStateDict(dir + "/sharded"));
    ExpectIdentical(Parameters(*a), trained);
    auto b = FullyShardedModule::Shard(from_full.ptr(), from_full->units(), comm, {}).value();
    DRAY_ASSERT_OK(b->LoadShards(Checkpoint::Open(dir + "/full.safetensors").value()));
    ExpectIdentical(Parameters(*b), trained);
    EXPECT_THAT(b->LoadShardedStateDict(dir), StatusIs(absl::StatusCode::kNotFound));
  });
}

// A training checkpoint (masters and AdamW state) saved at W = 2 and
// resumed at W = 3 continues the training that W = 2 goes on with: a
// second step gives the same parameters, up to the order of the sums.
TEST(FullyShardedStateTest, TrainingCheckpointsResumeAtAnotherWorldSize) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/checkpoint";
  std::filesystem::create_directories(dir);
  const Data data = MakeData();
  auto step = [&](ToyModel& model, FullyShardedModule& sharded, torch::optim::AdamW& optimizer,
                  int rank, int world) {
    const int64_t rows = 12 / world;
    (model->forward(data.x.slice(0, rank * rows, (rank + 1) * rows), &sharded) -
     data.y.slice(0, rank * rows, (rank + 1) * rows))
        .pow(2)
        .mean()
        .backward();
    optimizer.step();
    optimizer.zero_grad();
  };
  std::map<std::string, at::Tensor> continued;
  RunInGroup(2, [&](int rank, Communicator* comm) {
    ToyModel model;
    auto sharded = FullyShardedModule::Shard(model.ptr(), model->units(), comm, {}).value();
    torch::optim::AdamW optimizer(sharded->shards(), Adam());
    step(model, *sharded, optimizer, rank, 2);
    DRAY_ASSERT_OK(sharded->SaveShardedLike(dir, "model", sharded->shards()));
    DRAY_ASSERT_OK(SaveAdamWState(*sharded, optimizer, dir));
    step(model, *sharded, optimizer, rank, 2);
    const auto parameters = Parameters(*sharded);
    if (rank == 0) continued = parameters;
  });
  RunInGroup(3, [&](int rank, Communicator* comm) {
    ToyModel model(/*seed=*/9);
    auto sharded = FullyShardedModule::Shard(model.ptr(), model->units(), comm, {}).value();
    torch::optim::AdamW optimizer(sharded->shards(), Adam());
    DRAY_ASSERT_OK(sharded->LoadShardedLike(dir, "model", sharded->shards()));
    DRAY_ASSERT_OK(LoadAdamWState(*sharded, optimizer, dir));
    step(model, *sharded, optimizer, rank, 3);
    for (const auto& [name, tensor] : Parameters(*sharded))
      EXPECT_LE(MaxDiff(tensor, continued.at(name)), 1e-6) << name;
    EXPECT_THAT(sharded->LoadShardedLike(dir, "adamw", sharded->shards()),
                StatusIs(absl::StatusCode::kNotFound, ::testing::HasSubstr("adamw-00000-of-")));
  });
}

TEST(FullyShardedStateTest, LocalStateDictRoundTripsAtTheSameWorldSize) {
  RunInGroup(2, [&](int rank, Communicator* comm) {
    ToyModel trained(/*seed=*/1), fresh(/*seed=*/2);
    auto a = FullyShardedModule::Shard(trained.ptr(), trained->units(), comm, {}).value();
    auto b = FullyShardedModule::Shard(fresh.ptr(), fresh->units(), comm, {}).value();
    DRAY_ASSERT_OK(b->LoadLocalStateDict(a->LocalStateDict()));
    ExpectIdentical(Parameters(*b), Parameters(*a));
    auto local = a->LocalStateDict();
    local[0].second = at::zeros({3});
    EXPECT_THAT(b->LoadLocalStateDict(local),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         ::testing::HasSubstr("'unit0' has shape [3]")));
  });
}

TEST(FullyShardedStateTest, RankZeroInitializationEqualsEveryRankLoading) {
  std::map<std::string, at::Tensor> expected;
  {
    ToyModel reference(/*seed=*/0);
    for (const auto& p : reference->named_parameters())
      expected[p.key()] = p.value().detach().clone();
  }
  for (bool deferred : {false, true}) {
    RunInGroup(3, [&](int rank, Communicator* comm) {
      // Only rank 0 holds the real weights; the others build different ones,
      // or (deferred) none at all: shape-only parameters.
      std::optional<DeferredAllocation> defer;
      if (deferred && rank != 0) defer.emplace();
      ToyModel model(/*seed=*/rank == 0 ? 0 : 100 + rank);
      defer.reset();
      if (deferred && rank != 0) {
        for (const auto& p : model->parameters()) EXPECT_EQ(p.storage().nbytes(), 0u);
      }
      ShardingOptions options;
      options.sync_module_states = true;
      auto sharded = FullyShardedModule::Shard(model.ptr(), model->units(), comm, options).value();
      ExpectIdentical(Parameters(*sharded), expected);  // units and replicated parameters alike
    });
  }
}

TEST(FullyShardedStateTest, ShapeOnlyModulesLoadTheirShardsStraightFromACheckpoint) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/toy.safetensors";
  std::map<std::string, at::Tensor> expected;
  {
    ToyModel reference(/*seed=*/3);
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& p : reference->named_parameters()) {
      expected[p.key()] = p.value().detach().clone();
      tensors.emplace_back(p.key(), p.value().detach());
    }
    DRAY_ASSERT_OK(WriteSafetensors(path, tensors));
  }
  RunInGroup(2, [&](int rank, Communicator* comm) {
    std::optional<DeferredAllocation> defer(std::in_place);
    ToyModel model;
    defer.reset();
    auto sharded = FullyShardedModule::Shard(model.ptr(), model->units(), comm, {}).value();
    DRAY_ASSERT_OK(sharded->LoadShards(Checkpoint::Open(path).value()));
    ExpectIdentical(Parameters(*sharded), expected);
  });
}

TEST(FullyShardedGradientTest, ClipGradNormUsesTheGlobalNorm) {
  const Data data = MakeData();
  ToyModel reference;
  (reference->forward(data.x, nullptr) - data.y).pow(2).mean().backward();
  double expected = 0;
  for (const auto& p : reference->parameters()) expected += p.grad().pow(2).sum().item<double>();
  expected = std::sqrt(expected);
  RunInGroup(2, [&](int rank, Communicator* comm) {
    ToyModel model;
    auto sharded = FullyShardedModule::Shard(model.ptr(), model->units(), comm, {}).value();
    (model->forward(data.x.slice(0, rank * 6, rank * 6 + 6), sharded.get()) -
     data.y.slice(0, rank * 6, rank * 6 + 6))
        .pow(2)
        .mean()
        .backward();
    DRAY_ASSERT_OK_AND_ASSIGN(double norm, sharded->ClipGradNorm(expected / 2));
    EXPECT_NEAR(norm, expected, 1e-6);
    EXPECT_NEAR(sharded->ClipGradNorm(1e9).value(), expected / 2, 1e-6);  // clipped to half
  });
}

TEST(ShardingStrategyTest, AcceptsNamesAndNumbers) {
  EXPECT_EQ(ParseShardingStrategy("FULL_SHARD").value(), ShardingStrategy::kFullShard);
  EXPECT_EQ(ParseShardingStrategy("shard_grad_op").value(), ShardingStrategy::kShardGradOp);
  EXPECT_EQ(ParseShardingStrategy("3").value(), ShardingStrategy::kNoShard);
  EXPECT_EQ(ParseShardingStrategy("5").value(), ShardingStrategy::kHybridShardZero2);
  EXPECT_THAT(ParseShardingStrategy("ZERO3"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("valid: FULL_SHARD (1), SHARD_GRAD_OP (2)")));
}

}  // namespace
}  // namespace dray
