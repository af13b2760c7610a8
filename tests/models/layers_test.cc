#include "workers/models/layers.h"

#include <ATen/ATen.h>

#include "gtest/gtest.h"

namespace dray {
namespace {

// Blocks of queries give the textbook attention, masks and all, whatever
// the block size: one query per block, a few, or everything at once.
TEST(DotProductAttentionTest, BlocksOfQueriesMatchTheWholeScoreMatrix) {
  at::manual_seed(0);
  const at::Tensor q = at::randn({2, 3, 37, 8}), k = at::randn({2, 3, 29, 8}),
                   v = at::randn({2, 3, 29, 8});
  const at::Tensor key_mask =
      (at::rand({2, 1, 1, 29}) > 0.3).index_put_({at::indexing::Slice(), 0, 0, 0}, true);
  const at::Tensor causal =
      at::ones({37, 29}, at::kBool).tril(-8).logical_or(at::eye(37, 29, at::kBool));
  for (const at::Tensor& allowed : {at::Tensor(), key_mask, causal}) {
    const at::Tensor whole = DotProductAttention(q, k, v, allowed, /*max_score_elements=*/1 << 30);
    for (int64_t block_scores : {6 * 29, 6 * 29 * 5, 6 * 29 * 36}) {
      EXPECT_TRUE(
          at::allclose(DotProductAttention(q, k, v, allowed, block_scores), whole, 1e-6, 1e-6))
          << "block of " << block_scores << " scores";
    }
  }
}

TEST(DotProductAttentionTest, OneQueryRowAtLeast) {
  const at::Tensor q = at::randn({1, 1, 4, 2}), k = at::randn({1, 1, 4, 2});
  EXPECT_TRUE(at::allclose(DotProductAttention(q, k, k, at::Tensor(), /*max_score_elements=*/1),
                           DotProductAttention(q, k, k, at::Tensor())));
}

}  // namespace
}  // namespace dray
