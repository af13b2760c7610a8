// Unit tests of QwenImageTransformer2DModel beyond parity (which parity_test
// covers): input checks and the real configuration on the meta device.
#include <string>

#include <ATen/ATen.h>

#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/io/safetensors.h"
#include "tests/models/reference.h"
#include "workers/models/component_weights.h"
#include "workers/models/qwen_image/transformer.h"

namespace dray::qwen_image {
namespace {

using ::dray::testing::StatusIs;

// LoadModel builds the reference model of `folder`.
QwenImageTransformer LoadModel(const std::string& folder) {
  auto parsed = TransformerConfig::FromFile(ReferencePath(folder + "/config.json"));
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  QwenImageTransformer model(*parsed, at::TensorOptions().dtype(at::kFloat));
  const absl::Status loaded =
      LoadStateDict(*model, OpenComponentWeights(ReferencePath(folder)).value());
  EXPECT_TRUE(loaded.ok()) << loaded;
  return model;
}

TEST(TransformerTest, RejectsBadInputsWithTheirShapes) {
  QwenImageTransformer model = LoadModel("transformer_tiny");
  const at::Tensor text = at::zeros({1, 7, 16});
  EXPECT_THAT(
      model->forward(at::zeros({1, 48, 15}), text, {}, at::zeros({1}), {{{1, 6, 4}, {1, 6, 4}}}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               ::testing::HasSubstr("hidden_states must be [B, S, 16], got [1, 48, 15]")));
  EXPECT_THAT(model->forward(at::zeros({1, 48, 16}), text, {}, at::zeros({1}), {{{1, 6, 4}}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("cover 24 tokens, hidden_states has 48")));
  EXPECT_THAT(model->forward(at::zeros({1, 48, 16}), text, at::ones({1, 6}), at::zeros({1}),
                             {{{1, 6, 4}, {1, 6, 4}}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("text mask must be [1, 7]")));
}

TEST(TransformerTest, RealConfigBuildsOnTheMetaDevice) {
  // The released Qwen-Image transformer: diffusers' defaults. Nothing is allocated.
  QwenImageTransformer model(TransformerConfig(), at::TensorOptions().device(at::kMeta));
  EXPECT_EQ(ParameterCount(*model), 20430401088);
  EXPECT_EQ(model->blocks()->size(), 60u);
  EXPECT_TRUE(model->named_parameters()["transformer_blocks.59.attn.to_out.0.weight"].is_meta());
}

}  // namespace
}  // namespace dray::qwen_image
