// The Qwen-Image transformer, sharded per block with FULL_SHARD over 2 Gloo
// ranks, computes what the unsharded model computes: the same forward output
// (bit for bit: gathering moves float32 values unchanged) and gradients
// within 1e-6.
#include <ATen/ATen.h>

#include <ATen/CPUGeneratorImpl.h>

#include "gtest/gtest.h"
#include "runtime/collectives/local_group.h"
#include "runtime/sharding/fully_sharded.h"
#include "workers/models/layers.h"
#include "workers/models/qwen_image/model.h"

namespace dray::qwen_image {
namespace {

QwenImageTransformer TinyTransformer() {
  QwenImageTransformer model(PresetNamed("tiny").value().transformer,
                             at::TensorOptions().dtype(at::kFloat));
  InitializeLikePyTorch(*model, at::make_generator<at::CPUGeneratorImpl>(5));
  return model;
}

struct Inputs {
  at::Tensor hidden, text, mask, timestep;
  std::vector<SampleImages> images;
};

Inputs MakeInputs(int64_t batch) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(6);
  Inputs inputs{at::randn({batch, 32, 16}, generator),
                at::randn({batch, 5, 16}, generator),
                at::ones({batch, 5}, at::kLong),
                at::rand({batch}, generator),
                {}};
  inputs.mask.slice(1, 3).fill_(0);  // padded text
  inputs.images.assign(batch, SampleImages{{1, 4, 4}, {1, 4, 4}});
  return inputs;
}

TEST(TransformerShardingTest, ShardedBlocksComputeWhatTheModelComputes) {
  at::set_num_threads(1);
  const Inputs inputs = MakeInputs(2);
  QwenImageTransformer reference = TinyTransformer();
  const at::Tensor expected =
      reference->forward(inputs.hidden, inputs.text, inputs.mask, inputs.timestep, inputs.images)
          .value();
  expected.pow(2).mean().backward();

  std::vector<at::Tensor> outputs(2), grads(2);
  const absl::Status ran = RunLocalGroup(2, [&](int rank, Communicator* comm) -> absl::Status {
    QwenImageTransformer model = TinyTransformer();
    std::vector<std::shared_ptr<torch::nn::Module>> units(model->blocks()->begin(),
                                                          model->blocks()->end());
    auto sharded = FullyShardedModule::Shard(model.ptr(), units, comm, {});
    if (!sharded.ok()) return sharded.status();
    model->set_unit_hooks(sharded->get());
    // Each rank runs the whole batch here, so averaged gradients equal the reference's.
    auto output =
        model->forward(inputs.hidden, inputs.text, inputs.mask, inputs.timestep, inputs.images);
    if (!output.ok()) return output.status();
    outputs[rank] = *output;
    outputs[rank].pow(2).mean().backward();
    grads[rank] =
        (*sharded)->shards()[1].grad();  // unit 1: this rank's half of block 1's flat gradient
    return absl::OkStatus();
  });
  ASSERT_TRUE(ran.ok()) << ran;
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_TRUE(at::equal(outputs[rank], expected)) << "rank " << rank;
  // Unit 1's flat gradient: this rank's half of [all block-1 parameter gradients, in order].
  // The last block's text stream feeds nothing, so its weights get no gradient: zeros.
  std::vector<at::Tensor> parts;
  for (const auto& p : reference->blocks()[1]->named_parameters()) {
    const at::Tensor& grad = p.value().grad();
    parts.push_back(grad.defined() ? grad.reshape(-1) : at::zeros({p.value().numel()}));
  }
  const at::Tensor flat = at::cat(parts);
  const int64_t half = grads[0].numel();
  const at::Tensor padded = at::constant_pad_nd(flat, {0, 2 * half - flat.numel()}, 0);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_LE(
        (grads[rank] - padded.slice(0, rank * half, (rank + 1) * half)).abs().max().item<double>(),
        1e-6);
  }
}

TEST(TransformerShardingTest, ActivationCheckpointingGivesIdenticalGradients) {
  const Inputs inputs = MakeInputs(2);
  std::vector<at::Tensor> outputs, grads;
  for (bool checkpoint : {false, true}) {
    QwenImageTransformer model = TinyTransformer();
    model->set_activation_checkpointing(checkpoint);
    outputs.push_back(
        model->forward(inputs.hidden, inputs.text, inputs.mask, inputs.timestep, inputs.images)
            .value());
    outputs.back().pow(2).mean().backward();
    grads.push_back(model->named_parameters()["transformer_blocks.0.attn.to_q.weight"].grad());
    EXPECT_TRUE(model->named_parameters()["time_text_embed.timestep_embedder.linear_1.weight"]
                    .grad()
                    .defined());
  }
  EXPECT_TRUE(at::equal(outputs[0], outputs[1]));
  EXPECT_TRUE(at::equal(grads[0], grads[1]));
}

}  // namespace
}  // namespace dray::qwen_image
