// FLUX.1 Kontext model directories: dray picks the family from
// model_index.json; what WriteRandomFluxKontextModel writes (init-model's
// flux-tiny) loads back and edits, deterministically per seed; FLUX.1
// Kontext [dev]'s real sizes build shape-only with its parameter counts;
// bad directories and inputs give clear errors.
#include "workers/models/flux/model.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "base/files.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/models/reference.h"
#include "workers/models/flux/kontext_pipeline.h"
#include "workers/models/model_index.h"
#include "workers/models/qwen_image/model.h"

namespace dray::flux {
namespace {

namespace fs = std::filesystem;
using ::dray::testing::StatusIs;
using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  const fs::path dir = fs::path(std::getenv("TEST_TMPDIR")) / name;
  fs::remove_all(dir);
  return dir.string();
}

std::string ReferenceModel() { return ReferenceDir("flux_kontext") + "/model"; }

// SmoothImage: a deterministic uint8 [height, width, 3] picture.
at::Tensor SmoothImage(int64_t height, int64_t width) {
  const at::Tensor y = at::linspace(0, 1, height).view({height, 1, 1});
  const at::Tensor x = at::linspace(0, 1, width).view({1, width, 1});
  const at::Tensor rgb = at::cat({y.expand({height, width, 1}), x.expand({height, width, 1}),
                                  (x * y).expand({height, width, 1})},
                                 2);
  return (rgb * 255).round().to(at::kByte);
}

TEST(FluxModelTest, ModelIndexNamesTheFamily) {
  EXPECT_EQ(ReadModelFamily(ReferenceModel()).value(), ModelFamily::kFluxKontext);
  const std::string qwen = TempDir("qwen");
  DRAY_ASSERT_OK(qwen_image::WriteRandomQwenImageModel(
      qwen, qwen_image::PresetNamed("tiny").value(), /*seed=*/0));
  EXPECT_EQ(ReadModelFamily(qwen).value(), ModelFamily::kQwenImage);
  EXPECT_THAT(ReadModelFamily(TempDir("nothing")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no model_index.json")));
  const std::string other = TempDir("other");
  fs::create_directories(other);
  DRAY_ASSERT_OK(WriteFile(other + "/model_index.json", R"({"_class_name": "FluxPipeline"})"));
  EXPECT_THAT(ReadModelFamily(other),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("FluxKontextPipeline), found \"FluxPipeline\"")));
  EXPECT_THAT(
      LoadFluxKontextModel(qwen, at::kFloat),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be FluxKontextPipeline")));
}

TEST(FluxModelTest, TinyPresetLoadsAndEditsDeterministically) {
  const std::string dir = TempDir("flux-tiny");
  DRAY_ASSERT_OK(WriteRandomFluxKontextModel(dir, FluxPresetNamed("flux-tiny").value(), 3));
  // The tokenizers are the reference directory's, byte for byte.
  for (const char* file :
       {"tokenizer/vocab.json", "tokenizer/merges.txt", "tokenizer_2/spiece.model"})
    EXPECT_EQ(ReadFile(dir + "/" + file).value(), ReadFile(ReferenceModel() + "/" + file).value());
  DRAY_ASSERT_OK_AND_ASSIGN(FluxKontextModel model, LoadFluxKontextModel(dir, at::kFloat));
  FluxKontextPipeline pipeline(std::move(model));
  KontextOptions options;
  options.num_inference_steps = 2;
  options.max_area = 32 * 48;
  options.width = 48;
  options.height = 32;
  options.auto_resize = false;  // the input stays 40x56, not a preferred ~1024^2
  const KontextEditInput input{SmoothImage(40, 56), "add a red hat", /*seed=*/5};
  int steps = 0;
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<at::Tensor> first,
                            pipeline.Edit({input, input}, options, [&](int step, int total) {
                              steps = step;
                              EXPECT_EQ(total, 4);
                              return absl::OkStatus();
                            }));
  EXPECT_EQ(steps, 4);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].sizes(), (std::vector<int64_t>{32, 48, 3}));
  EXPECT_TRUE(at::equal(first[0], first[1]));  // the same row and seed
  KontextEditInput other = input;
  other.seed = 6;
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<at::Tensor> second, pipeline.Edit({other}, options));
  EXPECT_FALSE(at::equal(first[0], second[0]));
}

TEST(FluxModelTest, BadInputsAreRejected) {
  DRAY_ASSERT_OK_AND_ASSIGN(FluxKontextModel model,
                            LoadFluxKontextModel(ReferenceModel(), at::kFloat));
  FluxKontextPipeline pipeline(std::move(model));
  KontextOptions options;
  options.num_inference_steps = 1;
  EXPECT_THAT(pipeline.Edit({{at::zeros({8, 8}, at::kByte), "x", 0}}, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("RGB uint8")));
  options.auto_resize = false;
  EXPECT_THAT(pipeline.Edit({{SmoothImage(4, 4), "x", 0}}, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("latent token")));
  options.num_inference_steps = 0;
  EXPECT_THAT(pipeline.Edit({{SmoothImage(16, 16), "x", 0}}, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_inference_steps")));
}

TEST(FluxModelTest, RealSizesBuildShapeOnlyWithTheReleasedParameterCounts) {
  const std::string dir = TempDir("flux-real");
  const FluxPreset real = FluxPresetNamed("flux-real").value();
  DeferredAllocation deferred;
  // FLUX.1 Kontext [dev]: transformer 11.9B, VAE 83.8M, CLIP-L 123M, T5-XXL encoder 4.76B.
  EXPECT_EQ(ParameterCount(*FluxTransformer(real.transformer, at::kBFloat16)), 11901408320);
  EXPECT_EQ(ParameterCount(*AutoencoderKL(real.vae, at::kBFloat16)), 83819683);
  EXPECT_EQ(ParameterCount(*clip::ClipTextModel(real.clip, at::kBFloat16)), 123060480);
  EXPECT_EQ(ParameterCount(*t5::T5Encoder(real.t5, at::kBFloat16)), 4762310656);
  EXPECT_THAT(FluxPresetNamed("flux-huge"), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace dray::flux
