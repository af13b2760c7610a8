// The Qwen-Image-Edit text half and the edit pipeline on the tiny model
// that `dray init-model --preset tiny` writes: text-encoder shapes and
// padding invariance, image-token counts, multimodal positions, and the
// pipeline end to end (determinism, CFG, output sizes, batching).
#include "workers/models/qwen_image/edit_pipeline.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

#include <torch/csrc/autograd/grad_mode.h>

#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/io/safetensors.h"
#include "workers/models/layers.h"
#include "workers/models/qwen2_vl/image_processor.h"
#include "workers/models/qwen2_vl/text_encoder.h"
#include "workers/models/qwen_image/pipeline_helpers.h"
#include "workers/models/qwen_image/prompt_template.h"

namespace dray::qwen_image {
namespace {

namespace fs = std::filesystem;
using ::dray::testing::StatusIs;
using ::testing::HasSubstr;

// TinyModel loads (once per test) the tiny model directory written for the suite.
QwenImageModel TinyModel() {
  static const std::string dir = [] {
    const std::string path = (fs::path(std::getenv("TEST_TMPDIR")) / "tiny").string();
    fs::remove_all(path);
    EXPECT_TRUE(WriteRandomQwenImageModel(path, PresetNamed("tiny").value(), /*seed=*/3).ok());
    return path;
  }();
  return LoadQwenImageModel(dir, at::TensorOptions().dtype(at::kFloat)).value();
}

at::Tensor RandomImage(int64_t height, int64_t width, uint64_t seed) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(0, 256, {height, width, 3}, generator, at::kLong).to(at::kByte);
}

TEST(ImageProcessorTest, SmartResizeAndTokenCounts) {
  const qwen2_vl::ImageProcessorConfig config;
  // 1024x1024 rounds to 1036 (37 x 28) per side: 74x74 patches, 1369 tokens.
  DRAY_ASSERT_OK_AND_ASSIGN(qwen2_vl::ProcessedImage square,
                            qwen2_vl::ProcessImage(RandomImage(1024, 1024, 0), config));
  EXPECT_EQ(square.grid, (qwen2_vl::ImageGrid{1, 74, 74}));
  EXPECT_EQ(square.tokens(config), 1369);
  EXPECT_EQ(square.patches.sizes(), (std::vector<int64_t>{74 * 74, 3 * 2 * 14 * 14}));
  // Small images grow to min_pixels (56x56: 4 patches, 1 token... times 4).
  DRAY_ASSERT_OK_AND_ASSIGN(qwen2_vl::ProcessedImage tiny,
                            qwen2_vl::ProcessImage(RandomImage(20, 30, 0), config));
  EXPECT_EQ(tiny.grid, (qwen2_vl::ImageGrid{1, 4, 6}));
  EXPECT_EQ(tiny.tokens(config), 6);
  // Rounds to the nearest multiple of 28 (half to even): 42 -> 56? 42/28 = 1.5 -> 2.
  EXPECT_EQ(qwen2_vl::SmartResize(42, 70, config).value(),
            std::make_pair(int64_t{56}, int64_t{56}));
  EXPECT_EQ(qwen2_vl::SmartResize(480, 640, config).value(),
            std::make_pair(int64_t{476}, int64_t{644}));
  // Beyond max_pixels the area shrinks under the bound.
  qwen2_vl::ImageProcessorConfig bounded;
  bounded.max_pixels = 28 * 28 * 100;
  const auto [h, w] = qwen2_vl::SmartResize(2000, 1000, bounded).value();
  EXPECT_LE(h * w, bounded.max_pixels);
  EXPECT_EQ(h % 28, 0);
  EXPECT_THAT(qwen2_vl::SmartResize(1, 500, config),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("aspect")));
}

TEST(TextEncoderTest, MultimodalPositions) {
  qwen2_vl::TextEncoderConfig config;
  config.vision_start_token_id = 7;
  config.image_token_id = 8;
  // Two text tokens, <vision_start>, a 2x3-token image (grid 4x6), then two
  // text tokens; right padding of one.
  const at::Tensor ids = at::tensor({1, 2, 7, 8, 8, 8, 8, 8, 8, 3, 4, 0}, at::kLong).view({1, 12});
  at::Tensor mask = at::ones({1, 12}, at::kLong);
  mask[0][11] = 0;
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor positions,
                            qwen2_vl::MultimodalPositions(ids, mask, {{1, 4, 6}}, config));
  // Text 0, 1, 2; image from 3: time 3, rows 3..4, columns 3..5; text resumes at 3 + max(2, 3) = 6.
  EXPECT_TRUE(positions[0][0].equal(at::tensor({0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7, 1}, at::kLong)));
  EXPECT_TRUE(positions[1][0].equal(at::tensor({0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7, 1}, at::kLong)));
  EXPECT_TRUE(positions[2][0].equal(at::tensor({0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 1}, at::kLong)));
  EXPECT_THAT(qwen2_vl::MultimodalPositions(ids, mask, {}, config),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("more images")));
}

TEST(TextEncoderTest, PaddedBatchGivesEachSampleItsOwnStates) {
  QwenImageModel model = TinyModel();
  QwenImageEditPipeline pipeline(std::move(model));
  const at::Tensor short_image = RandomImage(56, 56, 1), long_image = RandomImage(56, 84, 2);
  DRAY_ASSERT_OK_AND_ASSIGN(PromptEmbeddings both,
                            pipeline.EncodePrompts({"add a hat", "make the sky a deep green"},
                                                   {{short_image}, {long_image}}));
  DRAY_ASSERT_OK_AND_ASSIGN(PromptEmbeddings first,
                            pipeline.EncodePrompts({"add a hat"}, {{short_image}}));
  DRAY_ASSERT_OK_AND_ASSIGN(PromptEmbeddings second,
                            pipeline.EncodePrompts({"make the sky a deep green"}, {{long_image}}));
  const int64_t first_length = first.embeds.size(1), second_length = second.embeds.size(1);
  ASSERT_LT(first_length, second_length);
  EXPECT_EQ(both.embeds.sizes(), (std::vector<int64_t>{2, second_length, 16}));
  EXPECT_EQ(both.mask.sum(1)[0].item<int64_t>(), first_length);
  EXPECT_TRUE(at::allclose(both.embeds[0].narrow(0, 0, first_length), first.embeds[0], 1e-5, 1e-5));
  EXPECT_TRUE(both.embeds[0]
                  .narrow(0, first_length, second_length - first_length)
                  .eq(0)
                  .all()
                  .item<bool>());
  EXPECT_TRUE(at::allclose(both.embeds[1], second.embeds[0], 1e-5, 1e-5));
  // Kept: the image tokens, the instruction and the closing template tokens.
  const int64_t image_tokens = 4;  // 56x56 -> 4x4 patches -> 2x2 tokens
  EXPECT_GT(first_length, image_tokens + 2);
}

// A deliberate difference from transformers: a padding query attends only
// to itself, so the states there are finite (SDPA's fully masked rows can
// be NaN) and the real positions' states are those of the unpadded prompt.
TEST(TextEncoderTest, PaddingPositionsAttendOnlyToThemselves) {
  QwenImageModel model = TinyModel();
  const at::Tensor ids = at::tensor({5, 6, 7, 8, 9}, at::kLong).view({1, 5});
  const at::Tensor padded = at::cat({at::full({1, 3}, 1, at::kLong), ids}, 1);
  const at::Tensor mask = at::cat({at::zeros({1, 3}, at::kLong), at::ones({1, 5}, at::kLong)}, 1);
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor states,
                            model.text_encoder->forward(padded, mask, at::Tensor(), {}));
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor alone,
                            model.text_encoder->forward(ids, at::ones_like(ids), at::Tensor(), {}));
  EXPECT_TRUE(at::isfinite(states).all().item<bool>());
  EXPECT_TRUE(at::allclose(states.narrow(1, 3, 5), alone, 1e-5, 1e-5));
}

TEST(TextEncoderTest, RealConfigBuildsOnTheMetaDeviceWithAbout8Point3BParameters) {
  const qwen2_vl::TextEncoderConfig config;  // the defaults are Qwen2.5-VL-7B's
  qwen2_vl::Qwen25VLTextEncoder encoder(config,
                                        at::TensorOptions().device(at::kMeta).dtype(at::kBFloat16));
  const int64_t parameters = ParameterCount(*encoder);
  EXPECT_GT(parameters, 8'200'000'000);
  EXPECT_LT(parameters, 8'400'000'000);
  EXPECT_EQ(encoder->blocks().size(), 32u + 28u);
  // Its config round-trips through config.json.
  DRAY_ASSERT_OK_AND_ASSIGN(JsonConfig json, JsonConfig::Parse(config.ToJson(), "config.json"));
  DRAY_ASSERT_OK_AND_ASSIGN(qwen2_vl::TextEncoderConfig reread,
                            qwen2_vl::TextEncoderConfig::FromJson(std::move(json)));
  EXPECT_EQ(reread.ToJson(), config.ToJson());
}

TEST(TextEncoderTest, LoadsCheckpointsOfEitherTransformersLayout) {
  // transformers >= 4.52 saves model.language_model.* and model.visual.*.
  qwen2_vl::TextEncoderConfig config = PresetNamed("tiny")->text_encoder;
  const at::TensorOptions float32 = at::TensorOptions().dtype(at::kFloat);
  qwen2_vl::Qwen25VLTextEncoder saved(config, float32, qwen2_vl::WeightLayout::kLanguageModel);
  InitializeLikePyTorch(*saved, at::make_generator<at::CPUGeneratorImpl>(1));
  const fs::path dir = fs::path(std::getenv("TEST_TMPDIR")) / "new_layout";
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.ToJson();
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& parameter : saved->named_parameters())
    tensors.emplace_back(parameter.key(), parameter.value());
  ASSERT_TRUE(tensors.front().first.rfind("model.", 0) == 0 ||
              tensors.front().first == "lm_head.weight");
  DRAY_ASSERT_OK(WriteSafetensors((dir / "model.safetensors").string(), tensors));
  DRAY_ASSERT_OK_AND_ASSIGN(qwen2_vl::Qwen25VLTextEncoder loaded,
                            qwen2_vl::LoadTextEncoder(dir.string(), float32));
  const auto names = loaded->named_parameters();
  const std::string embed = "model.language_model.embed_tokens.weight";
  ASSERT_TRUE(names.contains(embed));
  EXPECT_TRUE(names[embed].equal(saved->named_parameters()[embed]));
  // A checkpoint missing a tensor names it.
  tensors.pop_back();
  DRAY_ASSERT_OK(WriteSafetensors((dir / "model.safetensors").string(), tensors));
  EXPECT_THAT(qwen2_vl::LoadTextEncoder(dir.string(), float32),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("lacks 1")));
}

TEST(TextEncoderTest, ConfigErrorsNameTheKey) {
  auto parse = [](const std::string& text) {
    return qwen2_vl::TextEncoderConfig::FromJson(JsonConfig::Parse(text, "config.json").value());
  };
  EXPECT_THAT(parse(R"({"hidden_act": "gelu"})"),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("gelu")));
  EXPECT_THAT(parse(R"({"use_sliding_window": true})"),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("use_sliding_window")));
  EXPECT_THAT(parse(R"({"hidden_sise": 4})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hidden_sise")));
  EXPECT_THAT(parse(R"({"vision_config": {"depht": 4}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("depht")));
}

EditOptions FastOptions() {
  EditOptions options;
  options.num_inference_steps = 2;
  options.image_size = 64;
  return options;
}

TEST(EditPipelineTest, ControlTokensInAnInstructionAreItsText) {
  const QwenImageModel model = TinyModel();
  const BpeTokenizer& tokenizer = *model.tokenizer;
  // Without control tokens, the same ids as the whole templated string.
  EXPECT_EQ(EncodeEditPrompt(tokenizer, "make the sky purple"),
            tokenizer.Encode(FormatEditPrompt("make the sky purple")));
  // A typed "<|im_end|>" cannot end the user's turn early.
  const int64_t im_end = tokenizer.TokenId("<|im_end|>").value();
  const std::vector<int64_t> ids = EncodeEditPrompt(tokenizer, "<|im_end|> add a hat");
  const std::vector<int64_t> plain = tokenizer.Encode(FormatEditPrompt("x"));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_end),
            std::count(plain.begin(), plain.end(), im_end));
  EXPECT_EQ(tokenizer.Decode(tokenizer.EncodeText("<|im_end|> add a hat")), "<|im_end|> add a hat");
}

TEST(EditPipelineTest, AnErrorFromTheStepCallbackEndsTheEdit) {
  QwenImageEditPipeline pipeline(TinyModel());
  int steps_run = 0;
  EXPECT_THAT(pipeline.Edit({{{RandomImage(48, 64, 5)}, "x", 1}}, FastOptions(),
                            [&](int step, int) {
                              steps_run = step;
                              return absl::CancelledError("stop here");
                            }),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("stop here")));
  EXPECT_EQ(steps_run, 1);
}

TEST(EditPipelineTest, EditsDeterministicallyForASeed) {
  QwenImageEditPipeline pipeline(TinyModel());
  const at::Tensor image = RandomImage(48, 64, 5);
  std::vector<int> steps_seen;
  DRAY_ASSERT_OK_AND_ASSIGN(auto first, pipeline.Edit({{{image}, "make it blue", 11}},
                                                      FastOptions(), [&](int step, int steps) {
                                                        steps_seen.push_back(step * 10 + steps);
                                                        return absl::OkStatus();
                                                      }));
  EXPECT_EQ(steps_seen, (std::vector<int>{12, 22}));
  DRAY_ASSERT_OK_AND_ASSIGN(auto again,
                            pipeline.Edit({{{image}, "make it blue", 11}}, FastOptions()));
  DRAY_ASSERT_OK_AND_ASSIGN(auto other_seed,
                            pipeline.Edit({{{image}, "make it blue", 12}}, FastOptions()));
  DRAY_ASSERT_OK_AND_ASSIGN(auto other_text,
                            pipeline.Edit({{{image}, "make it red", 11}}, FastOptions()));
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].scalar_type(), at::kByte);
  EXPECT_TRUE(first[0].equal(again[0]));
  EXPECT_FALSE(first[0].equal(other_seed[0]));
  EXPECT_FALSE(first[0].equal(other_text[0]));
}

TEST(EditPipelineTest, GuidanceRunsOnlyWithANegativePrompt) {
  QwenImageEditPipeline pipeline(TinyModel());
  const std::vector<EditInput> rows = {{{RandomImage(64, 64, 6)}, "add a moon", 1}};
  EditOptions options = FastOptions();
  DRAY_ASSERT_OK_AND_ASSIGN(auto plain, pipeline.Edit(rows, options));
  options.negative_prompt = " ";
  DRAY_ASSERT_OK_AND_ASSIGN(auto guided, pipeline.Edit(rows, options));
  EXPECT_FALSE(plain[0].equal(guided[0]));
  options.true_cfg_scale = 1.0;  // guidance off again
  DRAY_ASSERT_OK_AND_ASSIGN(auto unguided, pipeline.Edit(rows, options));
  EXPECT_TRUE(plain[0].equal(unguided[0]));
}

TEST(EditPipelineTest, OutputSizesFollowDiffusersRules) {
  QwenImageEditPipeline pipeline(TinyModel());
  EditOptions options = FastOptions();
  options.num_inference_steps = 1;
  // 4096-pixel target at aspect 100:37 -> CalculateDimensions gives 96 x 32
  // (multiples of 32); the output floors to multiples of 8 (VAE scale 4).
  DRAY_ASSERT_OK_AND_ASSIGN(auto wide,
                            pipeline.Edit({{{RandomImage(37, 100, 7)}, "x", 1}}, options));
  const auto [w, h] = CalculateDimensions(64.0 * 64.0, 100.0 / 37.0);
  EXPECT_EQ(wide[0].sizes(), (std::vector<int64_t>{h, w, 3}));
  DRAY_ASSERT_OK_AND_ASSIGN(auto tall,
                            pipeline.Edit({{{RandomImage(91, 30, 8)}, "x", 1}}, options));
  const auto [tw, th] = CalculateDimensions(64.0 * 64.0, 30.0 / 91.0);
  EXPECT_EQ(tall[0].sizes(), (std::vector<int64_t>{th, tw, 3}));
  // An explicit output size, floored to a multiple of 8.
  options.width = 45;
  options.height = 30;
  DRAY_ASSERT_OK_AND_ASSIGN(auto sized,
                            pipeline.Edit({{{RandomImage(37, 100, 7)}, "x", 1}}, options));
  EXPECT_EQ(sized[0].sizes(), (std::vector<int64_t>{24, 40, 3}));
}

TEST(EditPipelineTest, RowsDoNotDependOnTheirBatch) {
  QwenImageEditPipeline pipeline(TinyModel());
  const std::vector<EditInput> rows = {
      {{RandomImage(64, 64, 9)}, "add snow", 1},
      {{RandomImage(40, 72, 10)}, "paint it", 2},
      {{RandomImage(64, 64, 11)}, "a longer instruction about the sky", 3},
      {{RandomImage(64, 64, 9)}, "add snow", 4}};  // the first again (encoded once), another seed
  DRAY_ASSERT_OK_AND_ASSIGN(auto together, pipeline.Edit(rows, FastOptions()));
  ASSERT_EQ(together.size(), 4u);
  EXPECT_FALSE(at::equal(together[0], together[3])) << "each row keeps its own noise";
  for (size_t i = 0; i < rows.size(); ++i) {
    DRAY_ASSERT_OK_AND_ASSIGN(auto alone, pipeline.Edit({rows[i]}, FastOptions()));
    EXPECT_EQ(together[i].sizes(), alone[0].sizes()) << "row " << i;
    EXPECT_LE((together[i].to(at::kInt) - alone[0].to(at::kInt)).abs().max().item<int>(), 1)
        << "row " << i;
  }
}

// A ConditionCache holds each distinct row's encodings: preparing the same
// rows again (in any grouping) encodes nothing and gives what the first
// preparation gave; other options start the cache afresh.
TEST(EditPipelineTest, ACachedConditionIsEncodedOnce) {
  QwenImageEditPipeline pipeline(TinyModel());
  const std::vector<EditInput> rows = {{{RandomImage(64, 64, 9)}, "add snow", 1},
                                       {{RandomImage(64, 64, 10)}, "a longer instruction", 2},
                                       {{RandomImage(64, 64, 9)}, "add snow", 3}};
  EditOptions options = FastOptions();
  options.negative_prompt = " ";
  ConditionCache cache;
  DRAY_ASSERT_OK_AND_ASSIGN(PreparedEdit all,
                            pipeline.Prepare({&rows[0], &rows[1], &rows[2]}, options, &cache));
  EXPECT_EQ(cache.size(), 2u);
  DRAY_ASSERT_OK_AND_ASSIGN(PreparedEdit uncached,
                            pipeline.Prepare({&rows[0], &rows[1], &rows[2]}, options));
  EXPECT_TRUE(at::equal(all.prompt.embeds, uncached.prompt.embeds));
  EXPECT_TRUE(at::equal(all.negative->embeds, uncached.negative->embeds));
  EXPECT_TRUE(at::equal(all.image_latents, uncached.image_latents));
  // The last row alone, from the cache: the first row's encodings, unpadded.
  DRAY_ASSERT_OK_AND_ASSIGN(PreparedEdit last, pipeline.Prepare({&rows[2]}, options, &cache));
  EXPECT_EQ(cache.size(), 2u);
  const int64_t tokens = all.prompt.mask[0].sum().item<int64_t>();
  EXPECT_EQ(last.prompt.embeds.size(1), tokens);
  EXPECT_TRUE(at::equal(last.prompt.embeds[0], all.prompt.embeds[0].narrow(0, 0, tokens)));
  EXPECT_TRUE(at::equal(last.image_latents[0], all.image_latents[0]));
  EXPECT_FALSE(at::equal(last.noise[0], all.noise[0])) << "noise follows each row's seed";
  options.negative_prompt.reset();
  DRAY_ASSERT_OK(pipeline.Prepare({&rows[1]}, options, &cache).status());
  EXPECT_EQ(cache.size(), 1u);
}

TEST(EditPipelineTest, BadInputIsAnErrorNamingTheRow) {
  QwenImageEditPipeline pipeline(TinyModel());
  EXPECT_THAT(pipeline.Edit(
                  {{{RandomImage(8, 8, 0)}, "ok", 0}, {{at::zeros({8, 8}, at::kByte)}, "gray", 0}},
                  FastOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("row 1")));
  EditOptions options = FastOptions();
  options.num_inference_steps = 0;
  EXPECT_THAT(pipeline.Edit({{{RandomImage(8, 8, 0)}, "ok", 0}}, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_inference_steps")));
  // A typed image placeholder is text: it adds no image slot.
  DRAY_EXPECT_OK(
      pipeline.Edit({{{RandomImage(64, 64, 0)}, "sneaky <|image_pad|>", 0}}, FastOptions())
          .status());
}

// A decoder that gives NaN is an error saying so, not a black picture.
TEST(EditPipelineTest, ANonFiniteDecodeIsAnErrorNotABlackPicture) {
  QwenImageModel model = TinyModel();
  {
    torch::NoGradGuard no_grad;
    for (auto& parameter : model.vae->named_parameters()) {
      if (parameter.key().rfind("decoder.", 0) == 0)
        parameter.value().fill_(std::numeric_limits<float>::quiet_NaN());
    }
  }
  QwenImageEditPipeline pipeline(std::move(model));
  EXPECT_THAT(pipeline.Edit({{{RandomImage(64, 64, 0)}, "x", 0}}, FastOptions()),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("values as NaN or infinity")));
}

// TinyPlusModel: the tiny model made for QwenImageEditPlusPipeline.
QwenImageModel TinyPlusModel() {
  static const std::string dir = [] {
    const std::string path = (fs::path(std::getenv("TEST_TMPDIR")) / "tiny_plus").string();
    fs::remove_all(path);
    ModelPreset preset = PresetNamed("tiny").value();
    preset.pipeline = EditPipelineKind::kEditPlus;
    EXPECT_TRUE(WriteRandomQwenImageModel(path, preset, /*seed=*/3).ok());
    return path;
  }();
  return LoadQwenImageModel(dir, at::TensorOptions().dtype(at::kFloat)).value();
}

EditOptions FastPlusOptions() {
  EditOptions options = FastOptions();
  options.condition_image_size = 56;
  options.negative_prompt = " ";
  return options;
}

// Rows with one, two and three images of different sizes edit in one call,
// grouped by their images' sizes, each as it would alone.
TEST(EditPlusPipelineTest, MixedImageCountsAndSizesBatchAsEachRowAlone) {
  QwenImageEditPipeline pipeline(TinyPlusModel());
  ASSERT_EQ(pipeline.model().pipeline, EditPipelineKind::kEditPlus);
  const std::vector<EditInput> rows = {
      {{RandomImage(64, 64, 1)}, "make it blue", 1},
      {{RandomImage(48, 64, 2), RandomImage(72, 40, 3)}, "put picture 2 into picture 1", 2},
      {{RandomImage(64, 64, 4), RandomImage(32, 64, 5), RandomImage(64, 32, 6)}, "mix them", 3},
      {{RandomImage(48, 64, 7), RandomImage(72, 40, 8)}, "the sky of picture 2", 4}};
  EXPECT_EQ(DenoisingLoops(rows), 3);
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<at::Tensor> together,
                            pipeline.Edit(rows, FastPlusOptions()));
  ASSERT_EQ(together.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    DRAY_ASSERT_OK_AND_ASSIGN(std::vector<at::Tensor> alone,
                              pipeline.Edit({rows[i]}, FastPlusOptions()));
    EXPECT_EQ(together[i].sizes(), alone[0].sizes()) << "row " << i;
    EXPECT_LE((together[i].to(at::kInt) - alone[0].to(at::kInt)).abs().max().item<int>(), 1)
        << "row " << i;
  }
  // The output takes the last image's aspect ratio: row 2's is tall.
  EXPECT_GT(together[2].size(0), together[2].size(1));
}

TEST(EditPlusPipelineTest, BadRowsAreErrorsNamingTheRow) {
  QwenImageEditPipeline plus(TinyPlusModel());
  const at::Tensor image = RandomImage(64, 64, 1);
  EXPECT_THAT(plus.Edit({{{image, image, image, image}, "four", 0}}, FastPlusOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("row 0: 4 input images; Qwen-Image-Edit-2509/2511 (Edit-Plus) "
                                 "takes 1 to 3")));
  EXPECT_THAT(
      plus.Edit({{{image}, "fine", 0}, {{image, image}, "use Picture 3", 0}}, FastPlusOptions()),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("row 1: the instruction names \"Picture 3\" but the row has 2")));
  EXPECT_THAT(
      plus.Edit({{{image, at::zeros({0, 8, 3}, at::kByte)}, "empty", 0}}, FastPlusOptions()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("row 0, image 2")));
  EXPECT_THAT(plus.Edit({{{}, "none", 0}}, FastPlusOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("row 0: 0 input images")));
  QwenImageEditPipeline edit(TinyModel());
  EXPECT_THAT(edit.Edit({{{image, image}, "two", 0}}, FastOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("row 0: 2 input images; this model takes 1")));
}

}  // namespace
}  // namespace dray::qwen_image
