// FLUX.1's text encoders (CLIPTextModel, T5EncoderModel): their errors for
// bad input and configs, and shape-only building. Parity with transformers
// on tests/data/reference/flux_kontext/text_encoders runs in parity_test.
#include <string>

#include <ATen/ATen.h>

#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/models/reference.h"
#include "workers/models/clip/text_encoder.h"
#include "workers/models/json_config.h"
#include "workers/models/layers.h"
#include "workers/models/t5/encoder.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::HasSubstr;

std::string ModelDir(const std::string& component) {
  return ReferenceDir("flux_kontext") + "/model/" + component;
}

TEST(ClipTextModelTest, RejectsBadInput) {
  DRAY_ASSERT_OK_AND_ASSIGN(clip::ClipTextModel clip,
                            clip::LoadClipTextModel(ModelDir("text_encoder"), at::kFloat));
  EXPECT_THAT(
      clip->forward(at::zeros({2, 78}, at::kLong)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_position_embeddings 77")));
  EXPECT_THAT(clip->forward(at::zeros({77}, at::kLong)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[B, S]")));
  EXPECT_THAT(clip->forward(at::full({1, 3}, 1000, at::kLong)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[0, 1000)")));
}

TEST(T5EncoderTest, RejectsBadInput) {
  DRAY_ASSERT_OK_AND_ASSIGN(t5::T5Encoder t5,
                            t5::LoadT5Encoder(ModelDir("text_encoder_2"), at::kFloat));
  EXPECT_THAT(t5->forward(at::full({1, 4}, 500, at::kLong)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[0, 500)")));
  EXPECT_THAT(t5->forward(at::zeros({1, 4}, at::kFloat)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("integers")));
}

TEST(ClipTextModelTest, ConfigRoundTripsAndBuildsShapeOnly) {
  const std::string dir = ModelDir("text_encoder");
  DRAY_ASSERT_OK_AND_ASSIGN(clip::ClipTextConfig config,
                            clip::ClipTextConfig::FromFile(dir + "/config.json"));
  EXPECT_EQ(config.eos_token_id, 2);
  DRAY_ASSERT_OK_AND_ASSIGN(JsonConfig json, JsonConfig::Parse(config.ToJson(), "ToJson"));
  DRAY_ASSERT_OK_AND_ASSIGN(clip::ClipTextConfig again, clip::ClipTextConfig::FromJson(json));
  EXPECT_EQ(again.ToJson(), config.ToJson());
  DRAY_ASSERT_OK_AND_ASSIGN(clip::ClipTextModel clip,
                            clip::LoadClipTextModel(dir, at::kFloat, Weights::kShapeOnly));
  EXPECT_EQ(clip->blocks().size(), 2u);
  EXPECT_EQ(clip->named_parameters().size(), 4u + 2u * 16u);  // as many as the checkpoint's
}

TEST(T5EncoderTest, ConfigRoundTripsAndBuildsShapeOnly) {
  const std::string dir = ModelDir("text_encoder_2");
  DRAY_ASSERT_OK_AND_ASSIGN(t5::T5EncoderConfig config,
                            t5::T5EncoderConfig::FromFile(dir + "/config.json"));
  DRAY_ASSERT_OK_AND_ASSIGN(JsonConfig json, JsonConfig::Parse(config.ToJson(), "ToJson"));
  DRAY_ASSERT_OK_AND_ASSIGN(t5::T5EncoderConfig again, t5::T5EncoderConfig::FromJson(json));
  EXPECT_EQ(again.ToJson(), config.ToJson());
  DRAY_ASSERT_OK_AND_ASSIGN(t5::T5Encoder t5,
                            t5::LoadT5Encoder(dir, at::kFloat, Weights::kShapeOnly));
  EXPECT_EQ(t5->blocks().size(), 2u);
  // The checkpoint's tensors but its tied copy encoder.embed_tokens.weight.
  EXPECT_EQ(t5->named_parameters().size(), 22u - 1u);
}

TEST(T5EncoderTest, RejectsAnUngatedFeedForward) {
  DRAY_ASSERT_OK_AND_ASSIGN(
      JsonConfig json,
      JsonConfig::Parse(R"({"model_type": "t5", "feed_forward_proj": "relu"})", "t5"));
  EXPECT_THAT(t5::T5EncoderConfig::FromJson(json),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("gated-gelu")));
}

TEST(T5EncoderTest, RejectsSizesItCannotRun) {
  DRAY_ASSERT_OK_AND_ASSIGN(
      t5::T5EncoderConfig config,
      t5::T5EncoderConfig::FromFile(ModelDir("text_encoder_2") + "/config.json"));
  nlohmann::json text = nlohmann::json::parse(config.ToJson());
  text["relative_attention_num_buckets"] = 2;  // no exact bucket: a division by zero
  DRAY_ASSERT_OK_AND_ASSIGN(JsonConfig json, JsonConfig::Parse(text.dump(), "t5"));
  EXPECT_THAT(
      t5::T5EncoderConfig::FromJson(json),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("relative_attention_num_buckets 2")));
  text["relative_attention_num_buckets"] = 32;
  text["num_heads"] = 0;
  DRAY_ASSERT_OK_AND_ASSIGN(json, JsonConfig::Parse(text.dump(), "t5"));
  EXPECT_THAT(t5::T5EncoderConfig::FromJson(json),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_heads must be")));
}

}  // namespace
}  // namespace dray
