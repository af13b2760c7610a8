// First-block caching of the transformer's passes (StepCache): threshold 0
// is the exact pass, bit for bit; a small change of the first block's
// residual reuses the later blocks' work, a large one computes them; under
// sequence parallelism the ranks decide alike and match one rank.
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "base/cpu_threads.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "runtime/collectives/local_group.h"
#include "tests/models/reference_transformer.h"
#include "workers/models/qwen_image/step_cache.h"
#include "workers/models/qwen_image/transformer.h"

namespace dray::qwen_image {
namespace {

// Passes: the latents of a few neighbouring steps (each a little away from
// the last, as a denoising loop's are), then one far away.
struct Passes {
  std::vector<at::Tensor> hidden;
  at::Tensor text, text_mask;
  std::vector<SampleImages> images = {{{1, 5, 3}, {1, 5, 3}}};
};

Passes MakePasses(const TransformerConfig& config) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(3);
  Passes p;
  const at::Tensor start = at::randn({1, 30, config.in_channels}, generator, at::kFloat);
  const at::Tensor drift = at::randn(start.sizes(), generator, at::kFloat);
  for (double t : {0.0, 0.01, 0.02, 0.03}) p.hidden.push_back(start + t * drift);
  p.hidden.push_back(at::randn(start.sizes(), generator, at::kFloat));  // far away
  p.text = at::randn({1, 7, config.joint_attention_dim}, generator, at::kFloat);
  p.text_mask = at::ones({1, 7}, at::kLong);
  return p;
}

// RunPasses: every pass of `p` through `model` with `cache` (null: none).
std::vector<at::Tensor> RunPasses(QwenImageTransformer& model, const Passes& p, StepCache* cache) {
  torch::NoGradGuard no_grad;
  model->set_step_cache(cache);
  std::vector<at::Tensor> outputs;
  for (const at::Tensor& hidden : p.hidden) {
    outputs.push_back(
        model->forward(hidden, p.text, p.text_mask, at::full({1}, 0.5), p.images).value());
  }
  model->set_step_cache(nullptr);
  return outputs;
}

TEST(StepCacheTest, ThresholdZeroIsTheExactPass) {
  DRAY_ASSERT_OK_AND_ASSIGN(QwenImageTransformer model,
                            LoadReferenceTransformer("transformer_small"));
  const Passes p = MakePasses(model->config());
  const std::vector<at::Tensor> exact = RunPasses(model, p, nullptr);
  StepCache cache({/*threshold=*/0, /*warmup_steps=*/0});
  const std::vector<at::Tensor> cached = RunPasses(model, p, &cache);
  for (size_t i = 0; i < exact.size(); ++i) EXPECT_TRUE(at::equal(cached[i], exact[i])) << i;
  EXPECT_EQ(cache.passes(), 5);
  EXPECT_EQ(cache.reused(), 0);
}

// After one warm-up pass, the neighbouring passes reuse the later blocks
// (close to, not equal to, the exact output); the far one computes them.
TEST(StepCacheTest, NeighbouringPassesReuseTheLaterBlocksAndAFarOneComputesThem) {
  DRAY_ASSERT_OK_AND_ASSIGN(QwenImageTransformer model,
                            LoadReferenceTransformer("transformer_small"));
  const Passes p = MakePasses(model->config());
  const std::vector<at::Tensor> exact = RunPasses(model, p, nullptr);
  StepCache cache({/*threshold=*/0.2, /*warmup_steps=*/1});
  const std::vector<at::Tensor> cached = RunPasses(model, p, &cache);
  EXPECT_TRUE(at::equal(cached[0], exact[0])) << "the warm-up pass is computed";
  for (size_t i = 1; i < 4; ++i) {
    const double error = (cached[i] - exact[i]).abs().max().item<double>();
    EXPECT_GT(error, 0) << "pass " << i << " should have reused the later blocks";
    EXPECT_LT(error, 0.1 * exact[i].abs().max().item<double>()) << "pass " << i;
  }
  EXPECT_TRUE(at::equal(cached[4], exact[4])) << "the far pass is computed";
  EXPECT_EQ(cache.reused(), 3);
}

// Two sequence-parallel ranks see parts of the residual, sum them, and so
// reuse on the same passes as one rank, with its outputs within 1e-5.
TEST(StepCacheTest, SequenceParallelRanksDecideAsOneRank) {
  DRAY_ASSERT_OK_AND_ASSIGN(QwenImageTransformer whole,
                            LoadReferenceTransformer("transformer_small"));
  const Passes p = MakePasses(whole->config());
  StepCache one_rank({0.2, 1});
  const std::vector<at::Tensor> expected = RunPasses(whole, p, &one_rank);
  DRAY_EXPECT_OK(RunLocalGroup(2, [&](int rank, Communicator* comm) -> absl::Status {
    UseOneCpuThreadPerCaller();
    DRAY_ASSIGN_OR_RETURN(QwenImageTransformer model,
                          LoadReferenceTransformer("transformer_small"));
    DRAY_RETURN_IF_ERROR(model->set_sequence_group(comm));
    StepCache cache({0.2, 1});
    const std::vector<at::Tensor> outputs = RunPasses(model, p, &cache);
    EXPECT_EQ(cache.reused(), one_rank.reused()) << "rank " << rank;
    for (size_t i = 0; i < outputs.size(); ++i)
      EXPECT_LE((outputs[i] - expected[i]).abs().max().item<double>(), 1e-5) << "pass " << i;
    return absl::OkStatus();
  }));
}

}  // namespace
}  // namespace dray::qwen_image
