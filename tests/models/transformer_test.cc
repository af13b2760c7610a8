// Unit tests of QwenImageTransformer2DModel beyond parity (which parity_test
// covers): input checks, the real configuration on the meta device, and
// LoRA adapters on its attention and feed-forward projections.
#include <cstdlib>
#include <string>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/io/safetensors.h"
#include "tests/models/reference_transformer.h"
#include "workers/models/lora.h"
#include "workers/models/qwen_image/transformer.h"

namespace dray::qwen_image {
namespace {

using ::dray::testing::StatusIs;

// LoadModel builds the reference model of `folder`.
QwenImageTransformer LoadModel(const std::string& folder) {
  absl::StatusOr<QwenImageTransformer> model = LoadReferenceTransformer(folder);
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
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

// Forward runs `model` on fixed random inputs of the tiny configuration.
at::Tensor Forward(QwenImageTransformer& model) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor hidden = at::randn({1, 48, 16}, generator, at::kFloat);
  const at::Tensor text = at::randn({1, 7, 16}, generator, at::kFloat);
  absl::StatusOr<at::Tensor> out = model->forward(hidden, text, at::ones({1, 7}, at::kLong),
                                                  at::full({1}, 0.6), {{{1, 6, 4}, {1, 6, 4}}});
  EXPECT_TRUE(out.ok()) << out.status();
  return out.value_or(at::Tensor());
}

const LoraOptions kLora{4, 8, {"to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "img_mlp.net.2"}};

TEST(TransformerLoraTest, FreshAdaptersChangeNothingAndAloneTrain) {
  QwenImageTransformer model = LoadModel("transformer_tiny");
  const at::Tensor base = Forward(model);
  DRAY_ASSERT_OK_AND_ASSIGN(
      int adapted, AddLoraAdapters(*model, kLora, at::make_generator<at::CPUGeneratorImpl>(1)));
  EXPECT_EQ(adapted, 2 * 6);  // two blocks
  EXPECT_TRUE(at::equal(Forward(model), base));
  for (const auto& named : model->named_parameters()) {
    EXPECT_EQ(named.value().requires_grad(), named.key().find(".lora_") != std::string::npos)
        << named.key();
  }
  const std::map<std::string, at::Tensor> state = LoraState(*model);
  EXPECT_EQ(state.size(), 2u * 2 * 6);
  ASSERT_TRUE(state.count("transformer_blocks.1.attn.to_out.0.lora_B.weight"));
  EXPECT_EQ(state.at("transformer_blocks.1.attn.to_q.lora_A.weight").sizes(),
            (std::vector<int64_t>{4, 48}));  // [rank, in_features]
}

TEST(TransformerLoraTest, MergingGivesTheAdaptedModelAndDisablingTheBase) {
  QwenImageTransformer model = LoadModel("transformer_tiny");
  const at::Tensor base = Forward(model);
  DRAY_ASSERT_OK(
      AddLoraAdapters(*model, kLora, at::make_generator<at::CPUGeneratorImpl>(1)).status());
  {
    torch::NoGradGuard no_grad;
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(2);
    for (auto& [name, tensor] : LoraState(*model)) {
      if (name.find("lora_B") != std::string::npos) tensor.normal_(0, 0.2, generator);
    }
  }
  const at::Tensor adapted = Forward(model);
  EXPECT_GT((adapted - base).abs().max().item<double>(), 1e-3);
  SetLoraEnabled(*model, false);
  EXPECT_TRUE(at::equal(Forward(model), base));
  SetLoraEnabled(*model, true);
  MergeLoraAdapters(*model);
  EXPECT_TRUE(LoraState(*model).empty());
  EXPECT_LT((Forward(model) - adapted).abs().max().item<double>(), 1e-6);
}

TEST(TransformerLoraTest, ASavedLoraFileLoadsIntoAFreshModel) {
  QwenImageTransformer trained = LoadModel("transformer_tiny");
  DRAY_ASSERT_OK(
      AddLoraAdapters(*trained, kLora, at::make_generator<at::CPUGeneratorImpl>(1)).status());
  std::vector<std::pair<std::string, at::Tensor>> file;
  {
    torch::NoGradGuard no_grad;
    for (auto& [name, tensor] : LoraState(*trained)) {
      tensor.normal_(0, 0.2, at::make_generator<at::CPUGeneratorImpl>(name.size()));
      file.emplace_back("transformer." + name, tensor);
    }
  }
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/lora.safetensors";
  DRAY_ASSERT_OK(WriteSafetensors(path, file, {{"lora_alpha", "8"}}));
  QwenImageTransformer fresh = LoadModel("transformer_tiny");
  DRAY_ASSERT_OK_AND_ASSIGN(int adapted, LoadLoraAdapters(*fresh, path));
  EXPECT_EQ(adapted, 12);
  EXPECT_TRUE(at::equal(Forward(fresh), Forward(trained)));
  EXPECT_THAT(LoadLoraAdapters(*LoadModel("transformer_tiny"), "/nonexistent.safetensors").status(),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(TransformerLoraTest, RefusesTargetsThatMatchNothing) {
  QwenImageTransformer model = LoadModel("transformer_tiny");
  EXPECT_THAT(AddLoraAdapters(*model, {4, 8, {"to_q", "to_qq"}},
                              at::make_generator<at::CPUGeneratorImpl>(1))
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("'to_qq' matches no Linear layer")));
}

}  // namespace
}  // namespace dray::qwen_image
