// FullyShardedModule on a GPU, over NCCL at world size 1 (one device):
//
// - torch_dtype bfloat16 over float32 masters, as a worker's configuration
//   shards the small preset's transformer (EditSharding): parameters on the
//   GPU in bfloat16, masters float32, and one optimizer step that tracks the
//   same step of the unsharded float32 model on the CPU within bfloat16's
//   rounding (gpu_test_util.h derives the tolerances);
// - fsdp_cpu_offload on the edit model as a worker loads it: between
//   forward passes the masters wait in CPU memory and the device holds only
//   the replicated parameters; a unit's parameters occupy device memory
//   only while it runs; the images are those computed without offload.
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/sgd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "runtime/sharding/fully_sharded.h"
#include "runtime/sharding/tensor_storage.h"
#include "runtime/worker/worker.h"
#include "tests/gpu/gpu_test_util.h"
#include "workers/models/layers.h"
#include "workers/models/qwen_image/edit_pipeline.h"
#include "workers/models/qwen_image/model.h"
#include "workers/pipeline/edit_config.h"
#include "workers/pipeline/edit_model.h"

namespace dray {
namespace {

using qwen_image::QwenImageTransformer;
using qwen_image::SampleImages;

using GpuShardingTest = CudaTest;

// SmallTransformer: the small preset's transformer, float32 on the CPU, with
// PyTorch's default initialization drawn from one seed (every call alike).
QwenImageTransformer SmallTransformer() {
  QwenImageTransformer model(qwen_image::PresetNamed("small").value().transformer,
                             at::TensorOptions().dtype(at::kFloat));
  InitializeLikePyTorch(*model, at::make_generator<at::CPUGeneratorImpl>(5));
  return model;
}

struct Inputs {
  at::Tensor hidden, text, mask, timestep, target;
  std::vector<SampleImages> images;

  Inputs To(at::Device device) const {
    return {hidden.to(device),   text.to(device),   mask.to(device),
            timestep.to(device), target.to(device), images};
  }
};

// MakeInputs: two samples of 16 noisy and 16 condition-image tokens, text of
// 7 tokens (the second padded after 4), and a regression target.
Inputs MakeInputs(const qwen_image::TransformerConfig& config) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(6);
  constexpr int64_t kBatch = 2, kText = 7, kTokens = 32;
  Inputs inputs;
  inputs.hidden = at::randn({kBatch, kTokens, config.in_channels}, generator);
  inputs.text = at::randn({kBatch, kText, config.joint_attention_dim}, generator);
  inputs.mask = at::ones({kBatch, kText}, at::kLong);
  inputs.mask[1].slice(0, 4).fill_(0);
  // Timesteps bfloat16 holds exactly. The model rounds t to its compute
  // dtype before the sinusoidal embedding of 1000 t (as diffusers does); a
  // rounding of t in [0.5, 1) by up to 2^-9 there turns the fastest
  // frequency by up to 2 radians: bfloat16's own behaviour, not sharding's,
  // and beyond any rounding bound.
  inputs.timestep = at::tensor({0.5, 0.25}, at::kFloat);
  inputs.target = at::randn(
      {kBatch, kTokens, config.patch_size * config.patch_size * config.out_channels}, generator);
  inputs.images.assign(kBatch, SampleImages{{1, 4, 4}, {1, 4, 4}});
  return inputs;
}

at::Tensor Forward(QwenImageTransformer& model, const Inputs& in) {
  return model->forward(in.hidden, in.text, in.mask, in.timestep, in.images).value();
}

at::Tensor Loss(const at::Tensor& output, const Inputs& in) {
  return at::mse_loss(AtLeastFloat32(output), in.target);
}

// FlatGradients: block `block`'s parameter gradients, concatenated in
// registration order (a unit's flat layout; zeros where none arrived).
at::Tensor FlatGradients(const torch::nn::Module& block) {
  std::vector<at::Tensor> parts;
  for (const at::Tensor& parameter : block.parameters()) {
    parts.push_back(parameter.grad().defined() ? parameter.grad().reshape(-1)
                                               : at::zeros({parameter.numel()}));
  }
  return at::cat(parts);
}

TEST_F(GpuShardingTest, Bfloat16OverFloat32MastersTracksAnUnshardedFloat32Step) {
  // The bounds (gpu_test_util.h): the forward output passed through the
  // transformer's roundings (3.6e-2); a gradient through those of forward
  // and of backward (each operation's gradient is rounded likewise) and one
  // more where the flat gradient is reduced in bfloat16 (5.1e-2). SGD, not
  // Adam: its step is -lr g, so the step's error is the gradient's (Adam's
  // first step, lr sign(g), would hide it but where bfloat16 flips a sign).
  const double forward_tolerance = Bfloat16Tolerance(kTransformerRoundings);
  const double gradient_tolerance = Bfloat16Tolerance(2 * kTransformerRoundings + 1);
  constexpr double kLr = 0.1;
  const Inputs inputs = MakeInputs(qwen_image::PresetNamed("small").value().transformer);

  // The reference: the whole model in float32 on the CPU, one SGD step.
  QwenImageTransformer reference = SmallTransformer();
  std::map<std::string, at::Tensor> initial;
  for (const auto& named : reference->named_parameters())
    initial[named.key()] = named.value().detach().clone();
  const at::Tensor expected = Forward(reference, inputs);
  Loss(expected, inputs).backward();
  std::vector<at::Tensor> expected_gradients;
  for (const auto& block : *reference->blocks())
    expected_gradients.push_back(FlatGradients(*block));
  torch::optim::SGD(reference->parameters(), torch::optim::SGDOptions(kLr)).step();
  at::Tensor expected_after;
  {
    torch::NoGradGuard no_grad;
    expected_after = Forward(reference, inputs);
  }

  // Sharded by block on the GPU as a worker with torch_dtype bfloat16 shards it.
  std::unique_ptr<Worker> worker = LoneWorker<Worker>();
  DRAY_ASSERT_OK_AND_ASSIGN(ImageEditConfig config,
                            ImageEditConfig::Load("", {"worker.image_edit.device=cuda",
                                                       "worker.image_edit.enable_fsdp=true",
                                                       "worker.image_edit.torch_dtype=bfloat16"}));
  DRAY_ASSERT_OK_AND_ASSIGN(ShardingOptions options, EditSharding(config, *worker));
  DRAY_ASSERT_OK_AND_ASSIGN(Communicator * nccl, worker->device_comm());
  QwenImageTransformer model = SmallTransformer();
  model->to(kCuda);
  const std::vector<std::shared_ptr<torch::nn::Module>> blocks(model->blocks()->begin(),
                                                               model->blocks()->end());
  DRAY_ASSERT_OK_AND_ASSIGN(std::unique_ptr<FullyShardedModule> sharded,
                            FullyShardedModule::Shard(model.ptr(), blocks, nccl, options));
  model->set_unit_hooks(sharded.get());
  EXPECT_EQ(sharded->DescribePrecision(),
            "trainable parameters stored as float32 shards, frozen ones in bfloat16, gathered "
            "and computed in bfloat16, gradients reduced in bfloat16");
  for (const auto& named : model->named_parameters()) {
    EXPECT_TRUE(named.value().is_cuda()) << named.key();
    EXPECT_EQ(named.value().scalar_type(), at::kBFloat16) << named.key();
  }
  const std::vector<at::Tensor> masters = sharded->shards();  // the blocks', then the rest
  ASSERT_GT(masters.size(), blocks.size());
  for (const at::Tensor& master : masters) {
    EXPECT_TRUE(master.is_cuda());
    EXPECT_EQ(master.scalar_type(), at::kFloat);
  }

  const Inputs on_gpu = inputs.To(kCuda);
  const at::Tensor output = Forward(model, on_gpu);
  EXPECT_TRUE(output.is_cuda());
  EXPECT_EQ(output.scalar_type(), at::kBFloat16);
  ExpectErrorWithin("output_error", RelativeError(output, expected), forward_tolerance);
  Loss(output, on_gpu).backward();
  for (size_t i = 0; i < blocks.size(); ++i) {
    const at::Tensor& gradient = masters[i].grad();
    ASSERT_TRUE(gradient.defined()) << "block " << i;
    EXPECT_TRUE(gradient.is_cuda()) << "block " << i;
    EXPECT_EQ(gradient.scalar_type(), at::kFloat) << "block " << i;
    ExpectErrorWithin(absl::StrCat("gradient_error_block_", i),
                      RelativeError(gradient, expected_gradients[i]), gradient_tolerance);
  }
  for (const auto& named : model->named_parameters())
    EXPECT_FALSE(named.value().grad().defined()) << named.key() << ": gradients go to the masters";

  DRAY_ASSERT_OK_AND_ASSIGN(auto before, sharded->FullParameters());
  torch::optim::SGD(masters, torch::optim::SGDOptions(kLr)).step();
  DRAY_ASSERT_OK_AND_ASSIGN(auto after, sharded->FullParameters());
  ASSERT_EQ(before.size(), initial.size());
  std::vector<at::Tensor> steps, expected_steps;
  for (size_t i = 0; i < before.size(); ++i) {
    const std::string& name = before[i].first;
    ASSERT_EQ(after[i].first, name);
    EXPECT_EQ(after[i].second.scalar_type(), at::kFloat) << name;
    // The masters start as the float32 weights themselves, not a rounding.
    EXPECT_TRUE(at::equal(before[i].second.cpu(), initial.at(name))) << name;
    steps.push_back((after[i].second - before[i].second).cpu().reshape(-1));
    const at::Tensor now = reference->named_parameters()[name].detach();
    expected_steps.push_back((now - initial.at(name)).reshape(-1));
  }
  ExpectErrorWithin("step_error", RelativeError(at::cat(steps), at::cat(expected_steps)),
                    gradient_tolerance);

  // The next forward computes with the stepped masters, rounded again.
  torch::NoGradGuard no_grad;
  ExpectErrorWithin("output_error_after_step",
                    RelativeError(Forward(model, on_gpu), expected_after), forward_tolerance);
}

// MemoryProbe: the sharded transformer's unit hooks, passed on to the
// FullyShardedModule, measuring the CUDA memory that the transformer's
// parameters and masters hold when each forward pass starts, while each
// unit runs, and after it.
//
// This class is not thread-safe.
class MemoryProbe : public UnitHooks {
 public:
  MemoryProbe(FullyShardedModule& sharded, const torch::nn::Module& model)
      : sharded_(sharded), model_(model) {}

  void BeforeForward() override {
    sharded_.BeforeForward();
    at_start.push_back(Bytes());
  }
  void BeforeUnit(size_t index) override {
    sharded_.BeforeUnit(index);
    in_unit.emplace_back(index, Bytes());
  }
  void AfterUnit(size_t index, const std::vector<at::Tensor>& outputs) override {
    sharded_.AfterUnit(index, outputs);
    after_unit.push_back(Bytes());
  }

  std::vector<int64_t> at_start, after_unit;
  std::vector<std::pair<size_t, int64_t>> in_unit;

 private:
  int64_t Bytes() const {
    std::vector<at::Tensor> tensors = model_.parameters();
    for (const at::Tensor& master : sharded_.shards()) tensors.push_back(master);
    return CudaBytes(tensors);
  }

  FullyShardedModule& sharded_;
  const torch::nn::Module& model_;
};

TEST_F(GpuShardingTest, FsdpCpuOffloadKeepsTheMastersInCpuMemoryBetweenForwardPasses) {
  const std::vector<qwen_image::EditInput> inputs = {
      {{TestImage(40, 56, /*salt=*/0)}, "make the sky green", /*seed=*/7}};
  qwen_image::EditOptions options;  // two steps with guidance: four forward passes
  options.num_inference_steps = 2;
  options.true_cfg_scale = 4;
  options.negative_prompt = " ";
  options.image_size = 64;

  std::map<bool, std::vector<at::Tensor>> images;
  for (bool offload : {false, true}) {
    SCOPED_TRACE(offload ? "fsdp_cpu_offload: true" : "fsdp_cpu_offload: false");
    // float32 throughout, so that offloading changes nothing computed.
    DRAY_ASSERT_OK_AND_ASSIGN(
        ImageEditConfig config,
        ImageEditConfig::Load(
            "",
            {"worker.image_edit.model_path=" + SmallModelDir(), "worker.image_edit.device=cuda",
             "worker.image_edit.enable_fsdp=true",
             std::string("worker.image_edit.fsdp_cpu_offload=") + (offload ? "true" : "false")}));
    std::unique_ptr<Worker> worker = LoneWorker<Worker>();
    DRAY_ASSERT_OK_AND_ASSIGN(std::unique_ptr<EditModel> model, LoadEditModel(config, *worker));
    ASSERT_TRUE(model->sharded());
    qwen_image::QwenImageTransformerImpl& transformer = *model->model().transformer;

    // A unit is a block, whole at world size 1; everything else is
    // replicated and stays on the device.
    std::vector<int64_t> unit_bytes;
    int64_t blocks_bytes = 0, replicated_bytes = 0;
    for (const auto& block : *transformer.blocks()) {
      int64_t bytes = 0;
      for (const at::Tensor& parameter : block->parameters())
        bytes += parameter.numel() * parameter.element_size();
      unit_bytes.push_back(bytes);
      blocks_bytes += bytes;
    }
    for (const auto& named : transformer.named_parameters()) {
      if (!absl::StartsWith(named.key(), "transformer_blocks."))
        replicated_bytes += named.value().numel() * named.value().element_size();
    }

    MemoryProbe probe(*model->transformer_shards, transformer);
    transformer.set_unit_hooks(&probe);
    absl::StatusOr<std::vector<at::Tensor>> edited = model->pipeline->Edit(inputs, options);
    transformer.set_unit_hooks(model->transformer_shards.get());
    ASSERT_TRUE(edited.ok()) << edited.status();
    images[offload] = *edited;

    const int64_t resident = replicated_bytes + (offload ? 0 : blocks_bytes);
    ASSERT_EQ(probe.at_start.size(), 4u);
    for (int64_t bytes : probe.at_start) EXPECT_EQ(bytes, resident) << "when a forward pass starts";
    ASSERT_EQ(probe.in_unit.size(), 4 * unit_bytes.size());
    for (const auto& [unit, bytes] : probe.in_unit)
      EXPECT_EQ(bytes, resident + unit_bytes[unit]) << "while unit " << unit << " runs";
    for (int64_t bytes : probe.after_unit) EXPECT_EQ(bytes, resident) << "after a unit";

    // Between calls: the blocks' masters (the first shards) where the
    // option puts them, their gathered parameters released.
    for (FullyShardedModule* shards :
         {model->transformer_shards.get(), model->text_encoder_shards.get()}) {
      const std::vector<at::Tensor> masters = shards->shards();
      const size_t units = shards == model->transformer_shards.get()
                               ? transformer.blocks()->size()
                               : model->model().text_encoder->blocks().size();
      ASSERT_GE(masters.size(), units);
      for (size_t i = 0; i < units; ++i)
        EXPECT_EQ(masters[i].is_cuda(), !offload) << "master shard " << i;
    }
    for (const auto& named : transformer.named_parameters()) {
      const bool in_block = absl::StartsWith(named.key(), "transformer_blocks.");
      EXPECT_TRUE(named.value().is_cuda()) << named.key();
      EXPECT_EQ(HasStorage(named.value()), !in_block) << named.key();
    }
  }
  ASSERT_EQ(images[true].size(), 1u);
  ASSERT_EQ(images[false].size(), 1u);
  const at::Tensor levels =
      (images[true][0].to(at::kInt) - images[false][0].to(at::kInt)).abs().max();
  EXPECT_LE(levels.item<int>(), 1) << "offloading changed the image";
}

}  // namespace
}  // namespace dray
