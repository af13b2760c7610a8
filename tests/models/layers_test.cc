#include "workers/models/layers.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "base/libtorch_compat.h"
#include "gtest/gtest.h"

namespace dray {
namespace {

// Inputs of attention with every kind of mask the models use: none, keys
// masked per batch (text padding), and a causal pattern.
struct AttentionCase {
  at::Tensor q, k, v;
  std::vector<at::Tensor> masks;
};

AttentionCase MakeAttentionCase(at::ScalarType dtype) {
  at::manual_seed(0);
  const auto options = at::TensorOptions().dtype(dtype);
  AttentionCase c{at::randn({2, 3, 37, 8}, options), at::randn({2, 3, 29, 8}, options),
                  at::randn({2, 3, 29, 8}, options)};
  const at::Tensor key_mask =
      (at::rand({2, 1, 1, 29}) > 0.3).index_put_({at::indexing::Slice(), 0, 0, 0}, true);
  const at::Tensor causal =
      at::ones({37, 29}, at::kBool).tril(-8).logical_or(at::eye(37, 29, at::kBool));
  c.masks = {at::Tensor(), key_mask, causal};
  return c;
}

// Blocks of queries give the textbook attention, masks and all, whatever
// the block size: one query per block, a few, or everything at once.
TEST(DotProductAttentionTest, BlocksOfQueriesMatchTheWholeScoreMatrix) {
  AttentionKernelScope blockwise(AttentionKernel::kBlockwise);
  const AttentionCase c = MakeAttentionCase(at::kFloat);
  for (const at::Tensor& allowed : c.masks) {
    const at::Tensor whole =
        DotProductAttention(c.q, c.k, c.v, allowed, /*max_score_elements=*/1 << 30);
    for (int64_t block_scores : {6 * 29, 6 * 29 * 5, 6 * 29 * 36}) {
      EXPECT_TRUE(at::allclose(DotProductAttention(c.q, c.k, c.v, allowed, block_scores), whole,
                               1e-6, 1e-6))
          << "block of " << block_scores << " scores";
    }
  }
}

// The fused kernel (LibTorch 2) computes what the blockwise one does: in
// float64 to rounding, in float32 within a few ulps of each output's sum.
TEST(DotProductAttentionTest, TheFusedKernelMatchesTheBlockwiseOne) {
  if (!kHasFusedAttention) GTEST_SKIP() << "LibTorch " << kLibTorchVersion << " has no fused SDPA";
  for (const auto& [dtype, tolerance] : {std::pair{at::kDouble, 1e-12}, {at::kFloat, 1e-5}}) {
    const AttentionCase c = MakeAttentionCase(dtype);
    for (size_t mask = 0; mask < c.masks.size(); ++mask) {
      const at::Tensor& allowed = c.masks[mask];
      at::Tensor blockwise, fused;
      {
        AttentionKernelScope scope(AttentionKernel::kBlockwise);
        blockwise = DotProductAttention(c.q, c.k, c.v, allowed);
      }
      {
        AttentionKernelScope scope(AttentionKernel::kFused);
        fused = DotProductAttention(c.q, c.k, c.v, allowed);
      }
      EXPECT_TRUE(at::allclose(fused, blockwise, tolerance, tolerance))
          << at::toString(dtype) << ", mask " << mask << ": "
          << (fused - blockwise).abs().max().item<double>();
    }
  }
}

// Inference computes in place what training computes out of place for
// autograd: the same attention, masks and all, bit for bit (a rollout's
// log-probabilities are those its update recomputes).
TEST(DotProductAttentionTest, InferenceMatchesTheDifferentiableBlocks) {
  AttentionKernelScope blockwise(AttentionKernel::kBlockwise);
  for (at::ScalarType dtype : {at::kDouble, at::kFloat}) {
    const AttentionCase c = MakeAttentionCase(dtype);
    const at::Tensor q = c.q.detach().requires_grad_();
    for (size_t mask = 0; mask < c.masks.size(); ++mask) {
      for (int64_t block_scores : {6 * 29, 6 * 29 * 5, 1 << 30}) {
        const at::Tensor differentiable =
            DotProductAttention(q, c.k, c.v, c.masks[mask], block_scores);
        ASSERT_TRUE(differentiable.requires_grad());
        at::Tensor in_place;
        {
          torch::NoGradGuard no_grad;
          in_place = DotProductAttention(q, c.k, c.v, c.masks[mask], block_scores);
        }
        EXPECT_TRUE(at::equal(in_place, differentiable.detach()))
            << at::toString(dtype) << ", mask " << mask << ", block of " << block_scores << ": "
            << (in_place - differentiable).abs().max().item<double>();
      }
    }
  }
}

TEST(DotProductAttentionTest, OneQueryRowAtLeast) {
  AttentionKernelScope blockwise(AttentionKernel::kBlockwise);
  const at::Tensor q = at::randn({1, 1, 4, 2}), k = at::randn({1, 1, 4, 2});
  EXPECT_TRUE(at::allclose(DotProductAttention(q, k, k, at::Tensor(), /*max_score_elements=*/1),
                           DotProductAttention(q, k, k, at::Tensor())));
}

}  // namespace
}  // namespace dray
