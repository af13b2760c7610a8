// Model directories in diffusers' layout: what WriteRandomQwenImageModel
// writes loads back with LoadQwenImageModel and runs; bad directories give
// clear errors.
#include "workers/models/qwen_image/model.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/io/safetensors.h"
#include "tests/models/reference.h"
#include "workers/models/component_weights.h"

namespace dray::qwen_image {
namespace {

namespace fs = std::filesystem;
using ::dray::testing::StatusIs;
using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  const fs::path dir = fs::path(std::getenv("TEST_TMPDIR")) / name;
  fs::remove_all(dir);
  return dir.string();
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(ModelDirTest, TinyModelLoadsAndRuns) {
  const std::string dir = TempDir("tiny");
  DRAY_ASSERT_OK(WriteRandomQwenImageModel(dir, PresetNamed("tiny").value(), /*seed=*/7));
  DRAY_ASSERT_OK_AND_ASSIGN(QwenImageModel model,
                            LoadQwenImageModel(dir, at::TensorOptions().dtype(at::kFloat)));
  // A 32x32 image: 8x8 latents of 4 channels, 4x4 tokens of 16.
  DRAY_ASSERT_OK_AND_ASSIGN(LatentDistribution dist,
                            model.vae->Encode(at::rand({1, 3, 1, 32, 32}) * 2 - 1));
  EXPECT_EQ(dist.mean.sizes(), (std::vector<int64_t>{1, 4, 1, 8, 8}));
  DRAY_ASSERT_OK_AND_ASSIGN(
      at::Tensor out, model.transformer->forward(at::randn({1, 32, 16}), at::randn({1, 5, 16}), {},
                                                 at::full({1}, 0.5), {{{1, 4, 4}, {1, 4, 4}}}));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{1, 32, 16}));
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor image, model.vae->Decode(dist.mean));
  EXPECT_EQ(image.sizes(), (std::vector<int64_t>{1, 3, 1, 32, 32}));
  EXPECT_TRUE(at::isfinite(out).all().item<bool>() && at::isfinite(image).all().item<bool>());
  EXPECT_TRUE(model.scheduler.use_dynamic_shifting);
}

// diffusers' pipelines load a model directory's tokenizer/ and processor/
// with transformers, whose Python tokenizers read vocab.json, merges.txt
// and tokenizer_config.json: dray writes them as transformers wrote them
// for the Edit-Plus reference's model (same tokenizer, same files).
TEST(ModelDirTest, TokenizerFilesAreWhatTransformersWrites) {
  const fs::path reference = fs::path(ReferenceDir("qwen_image_edit_plus")) / "model" / "tokenizer";
  DRAY_ASSERT_OK_AND_ASSIGN(BpeTokenizer tokenizer,
                            BpeTokenizer::FromDirectory(reference.string()));
  const fs::path written = TempDir("tokenizer");
  DRAY_ASSERT_OK(WriteQwen2TokenizerFiles(written.string(), tokenizer));
  EXPECT_EQ(ReadFile(written / "merges.txt"), ReadFile(reference / "merges.txt"));
  for (const char* file : {"vocab.json", "added_tokens.json", "tokenizer_config.json"}) {
    nlohmann::json expected = nlohmann::json::parse(ReadFile(reference / file));
    expected.erase("backend");  // transformers 5's own marker; version 4 writes none
    EXPECT_EQ(nlohmann::json::parse(ReadFile(written / file)), expected) << file;
  }
  // Without tokenizer.json, the Python tokenizer's files encode the same.
  fs::remove(written / "tokenizer.json");
  DRAY_ASSERT_OK_AND_ASSIGN(BpeTokenizer reread, BpeTokenizer::FromDirectory(written.string()));
  const std::string prompt =
      "<|im_start|>user\nPicture 1: <|vision_start|><|image_pad|>"
      "<|vision_end|>Make the sky blue.<|im_end|>";
  EXPECT_EQ(reread.Encode(prompt), tokenizer.Encode(prompt));
}

TEST(ModelDirTest, ProcessorAndTokenizerFoldersHoldEveryTokenizerFile) {
  const fs::path dir = TempDir("files");
  DRAY_ASSERT_OK(WriteRandomQwenImageModel(dir.string(), PresetNamed("tiny").value(), 1));
  for (const char* folder : {"tokenizer", "processor"}) {
    for (const char* file : {"tokenizer.json", "vocab.json", "merges.txt", "added_tokens.json",
                             "tokenizer_config.json"}) {
      EXPECT_TRUE(fs::exists(dir / folder / file)) << folder << "/" << file;
    }
  }
  EXPECT_TRUE(fs::exists(dir / "processor" / "preprocessor_config.json"));
}

TEST(ModelDirTest, SameSeedWritesTheSameWeights) {
  const std::string a = TempDir("a"), b = TempDir("b"), c = TempDir("c");
  DRAY_ASSERT_OK(WriteRandomQwenImageModel(a, PresetNamed("tiny").value(), 1));
  DRAY_ASSERT_OK(WriteRandomQwenImageModel(b, PresetNamed("tiny").value(), 1));
  DRAY_ASSERT_OK(WriteRandomQwenImageModel(c, PresetNamed("tiny").value(), 2));
  for (const char* file :
       {"transformer/diffusion_pytorch_model.safetensors",
        "vae/diffusion_pytorch_model.safetensors", "model_index.json", "transformer/config.json"}) {
    EXPECT_EQ(ReadFile(fs::path(a) / file), ReadFile(fs::path(b) / file)) << file;
  }
  EXPECT_NE(ReadFile(fs::path(a) / "transformer/diffusion_pytorch_model.safetensors"),
            ReadFile(fs::path(c) / "transformer/diffusion_pytorch_model.safetensors"));
}

TEST(ModelDirTest, BadDirectoriesGiveClearErrors) {
  const auto options = at::TensorOptions().dtype(at::kFloat);
  EXPECT_THAT(LoadQwenImageModel(TempDir("empty"), options),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no model_index.json")));

  const std::string dir = TempDir("broken");
  DRAY_ASSERT_OK(WriteRandomQwenImageModel(dir, PresetNamed("tiny").value(), 0));
  std::ofstream(fs::path(dir) / "model_index.json") << R"({"_class_name": "QwenImageEditPipeline",
            "transformer": ["diffusers", "FluxTransformer2DModel"], "vae": ["diffusers", "AutoencoderKLQwenImage"],
            "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"]})";
  EXPECT_THAT(
      LoadQwenImageModel(dir, options),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("component 'transformer' must be")));

  DRAY_ASSERT_OK(WriteRandomQwenImageModel(dir, PresetNamed("tiny").value(), 0));
  const std::string weights =
      (fs::path(dir) / "transformer/diffusion_pytorch_model.safetensors").string();
  auto file = SafetensorsFile::Open(weights).value();
  std::vector<std::pair<std::string, at::Tensor>> kept;
  for (const std::string& name : file->names()) {
    if (name != "proj_out.bias") kept.emplace_back(name, file->Get(name).value().clone());
  }
  file.reset();
  DRAY_ASSERT_OK(WriteSafetensors(weights, kept));
  EXPECT_THAT(
      LoadQwenImageModel(dir, options),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("lacks 1 parameters: proj_out.bias")));

  DRAY_ASSERT_OK(WriteRandomQwenImageModel(dir, PresetNamed("tiny").value(), 0));
  std::ofstream(fs::path(dir) / "vae/config.json")
      << R"({"z_dim": 4, "base_dim": 24, "flux_capacitor": 1})";
  EXPECT_THAT(LoadQwenImageModel(dir, options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown key flux_capacitor; known keys:")));
  EXPECT_THAT(PresetNamed("huge"), StatusIs(absl::StatusCode::kNotFound,
                                            HasSubstr("presets: tiny, embedded, small, real")));
}

// The reference checkpoints diffusers wrote open through their folders, with
// every tensor's dtype and shape as stored.
TEST(ModelDirTest, OpensTheWeightsOfDiffusersComponentFolders) {
  DRAY_ASSERT_OK_AND_ASSIGN(Checkpoint tiny,
                            OpenComponentWeights(ReferencePath("transformer_tiny")));
  int64_t parameters = 0;
  for (const std::string& name : tiny.names()) {
    const TensorInfo info = tiny.Info(name).value();
    EXPECT_EQ(info.dtype, at::kFloat) << name;
    parameters += tiny.Get(name).value().numel();
  }
  EXPECT_EQ(tiny.names().size(), 77u);
  EXPECT_EQ(parameters, 190720);

  DRAY_ASSERT_OK_AND_ASSIGN(Checkpoint small,
                            OpenComponentWeights(ReferencePath("transformer_small")));
  parameters = 0;
  for (const std::string& name : small.names()) parameters += small.Get(name).value().numel();
  EXPECT_EQ(parameters, 1886704);
  DRAY_ASSERT_OK_AND_ASSIGN(TensorInfo info, small.Info("proj_out.weight"));
  EXPECT_EQ(info.dtype, at::kBFloat16);
  EXPECT_EQ(info.shape, (std::vector<int64_t>{64, 128}));
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor widened,
                            small.Load("proj_out.weight", {64, 128}, at::kFloat));
  EXPECT_EQ(widened.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(widened.to(at::kBFloat16), small.Get("proj_out.weight").value()));  // exact
}

TEST(ModelDirTest, ComponentFoldersWithoutWeightsAreNotFound) {
  const std::string dir = TempDir("empty_component");
  fs::create_directories(dir);
  EXPECT_THAT(OpenComponentWeights(dir),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("diffusion_pytorch_model")));
}

}  // namespace
}  // namespace dray::qwen_image
