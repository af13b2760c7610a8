// Parity of QwenImageTransformer2DModel with diffusers on every case in
// reference/qwen_image/transformer_{tiny,small}: the sample within the
// README's atol = rtol = 1e-5, in float32 (BF16 weights widened exactly).
#include <filesystem>
#include <string>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "dispatch/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/safetensors.h"
#include "tests/models/reference.h"
#include "workers/models/qwen_image/pipeline_helpers.h"
#include "workers/models/qwen_image/transformer.h"

namespace dray::qwen_image {
namespace {

using ::dray::testing::StatusIs;

// AllClose: |a - b| <= atol + rtol |b| everywhere.
bool AllClose(const at::Tensor& a, const at::Tensor& b, double atol, double rtol) {
  return a.sizes() == b.sizes() && ((a - b).abs() <= atol + rtol * b.abs()).all().item<bool>();
}

// LoadModel builds the reference model of `folder` with the case's config overrides.
QwenImageTransformer LoadModel(const std::string& folder, const std::string& overrides) {
  nlohmann::json config = ReadReferenceJson(folder + "/config.json");
  config.merge_patch(nlohmann::json::parse(overrides));
  auto parsed = TransformerConfig::FromJson(JsonConfig::Parse(config.dump(), folder).value());
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  QwenImageTransformer model(*parsed, at::TensorOptions().dtype(at::kFloat));
  const absl::Status loaded = LoadStateDict(*model, Checkpoint::Open(ReferencePath(folder)).value());
  EXPECT_TRUE(loaded.ok()) << loaded;
  return model;
}

std::vector<SampleImages> ImageShapes(const std::string& text) {
  std::vector<SampleImages> shapes;
  for (const auto& sample : nlohmann::json::parse(text)) {
    SampleImages images;
    for (const auto& image : sample) images.push_back(image.get<ImageShape>());
    shapes.push_back(images);
  }
  return shapes;
}

struct Case {
  std::string folder;
  std::string file;
};

class TransformerParityTest : public ::testing::TestWithParam<Case> {};

TEST_P(TransformerParityTest, SampleMatchesDiffusers) {
  const Case& c = GetParam();
  auto file = SafetensorsFile::Open(ReferencePath(c.folder + "/" + c.file)).value();
  const auto& meta = file->metadata();
  QwenImageTransformer model = LoadModel(c.folder, meta.at("config_overrides"));
  const at::Tensor mask = file->contains("encoder_hidden_states_mask")
                              ? file->Get("encoder_hidden_states_mask").value()
                              : at::Tensor();
  DRAY_ASSERT_OK_AND_ASSIGN(
      at::Tensor sample,
      model->forward(file->Get("hidden_states").value(), file->Get("encoder_hidden_states").value(), mask,
                     file->Get("timestep").value(), ImageShapes(meta.at("img_shapes"))));
  const at::Tensor expected = file->Get("sample").value();
  RecordProperty("max_abs_diff", absl::StrCat(MaxAbsDiff(sample, expected)));
  RecordProperty("max_abs_value", absl::StrCat(expected.abs().max().item<double>()));
  EXPECT_TRUE(AllClose(sample, expected, 1e-5, 1e-5)) << "max abs diff " << MaxAbsDiff(sample, expected);

  // The pipeline keeps the noisy tokens and unpacks them.
  const auto hw = nlohmann::json::parse(meta.at("pixel_hw_noisy")).get<std::vector<int64_t>>();
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor noise_pred,
                            UnpackLatents(sample.slice(1, 0, std::stoll(meta.at("noisy_seq_len"))), hw[0],
                                          hw[1], std::stoll(meta.at("vae_scale_factor"))));
  EXPECT_TRUE(AllClose(noise_pred, file->Get("noise_pred_unpacked").value(), 1e-5, 1e-5));
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const std::string folder : {"transformer_tiny", "transformer_small"}) {
    for (const auto& entry : std::filesystem::directory_iterator(ReferencePath(folder))) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("case_", 0) == 0) cases.push_back({folder, name});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Reference, TransformerParityTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name = info.param.folder + "_" + info.param.file;
                           return name.substr(0, name.find('.'));
                         });

TEST(TransformerTest, RejectsBadInputsWithTheirShapes) {
  QwenImageTransformer model = LoadModel("transformer_tiny", "{}");
  const at::Tensor text = at::zeros({1, 7, 16});
  EXPECT_THAT(model->forward(at::zeros({1, 48, 15}), text, {}, at::zeros({1}), {{{1, 6, 4}, {1, 6, 4}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("hidden_states must be [B, S, 16], got [1, 48, 15]")));
  EXPECT_THAT(model->forward(at::zeros({1, 48, 16}), text, {}, at::zeros({1}), {{{1, 6, 4}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("cover 24 tokens, hidden_states has 48")));
  EXPECT_THAT(model->forward(at::zeros({1, 48, 16}), text, at::ones({1, 6}), at::zeros({1}), {{{1, 6, 4}, {1, 6, 4}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("text mask must be [1, 7]")));
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
