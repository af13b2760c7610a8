// Reading POST /v1/images/edits: OpenAI's form fields and dray's, the same
// as JSON, and each refusal naming its field.
#include "workers/edit/http_edit_request.h"

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::HasSubstr;

// kPng: the bytes stand in for a picture; the service decodes them later.
constexpr char kPng[] = "\x89PNG picture";

// FieldRefused: whether `request` failed with INVALID_ARGUMENT about `field`.
MATCHER_P(FieldRefused, field, "") {
  return arg.status().code() == absl::StatusCode::kInvalidArgument &&
         FieldOf(arg.status()) == field;
}

std::vector<FormPart> Form(std::vector<FormPart> more) {
  std::vector<FormPart> parts = {{"image", kPng}, {"prompt", "make it blue"}};
  parts.insert(parts.end(), more.begin(), more.end());
  return parts;
}

TEST(HttpEditRequestTest, ReadsOpenAisFieldsAndDraysOwn) {
  DRAY_ASSERT_OK_AND_ASSIGN(HttpEditRequest request,
                            ParseEditForm(Form({{"n", "3"},
                                                {"size", "64x48"},
                                                {"response_format", "b64_json"},
                                                {"model", "dray-embedded"},
                                                {"user", "someone"},
                                                {"steps", "4"},
                                                {"seed", "5"},
                                                {"true_cfg_scale", "4.5"},
                                                {"negative_prompt", "blurry"},
                                                {"timeout", "30"}})));
  ASSERT_EQ(request.batch.requests_size(), 3);
  for (int i = 0; i < 3; ++i) {
    const v1::EditImageRequest& row = request.batch.requests(i);
    EXPECT_EQ(row.image(), kPng);
    EXPECT_EQ(row.instruction(), "make it blue");
    EXPECT_EQ(row.seed(), 5 + i);
    EXPECT_EQ(row.width(), 64);
    EXPECT_EQ(row.height(), 48);
    EXPECT_EQ(row.num_inference_steps(), 4);
    EXPECT_EQ(row.true_cfg_scale(), 4.5);
    EXPECT_EQ(row.negative_prompt(), "blurry");
  }
  EXPECT_EQ(request.model, "dray-embedded");
  EXPECT_FALSE(request.stream);
  EXPECT_EQ(request.timeout, absl::Seconds(30));
}

TEST(HttpEditRequestTest, UnsetFieldsTakeTheServersAndSeedsAreDrawn) {
  DRAY_ASSERT_OK_AND_ASSIGN(HttpEditRequest request, ParseEditForm(Form({{"n", "2"}})));
  const v1::EditImageRequest& first = request.batch.requests(0);
  EXPECT_FALSE(first.has_num_inference_steps());
  EXPECT_FALSE(first.has_negative_prompt());
  EXPECT_EQ(first.width(), 0);  // the input's aspect ratio
  EXPECT_EQ(request.batch.requests(1).seed(), first.seed() + 1);
  EXPECT_EQ(request.timeout, absl::Minutes(10));
}

TEST(HttpEditRequestTest, SeveralPicturesInOrder) {
  DRAY_ASSERT_OK_AND_ASSIGN(HttpEditRequest request,
                            ParseEditForm({{"image[]", "one"},
                                           {"image[]", "two"},
                                           {"prompt", "give picture 1 the sky of picture 2"}}));
  EXPECT_EQ(request.batch.requests(0).image(), "one");
  EXPECT_THAT(request.batch.requests(0).more_images(), ::testing::ElementsAre("two"));
}

TEST(HttpEditRequestTest, EachRefusalNamesItsField) {
  EXPECT_THAT(ParseEditForm({{"prompt", "x"}}), FieldRefused("image"));
  EXPECT_THAT(ParseEditForm({{"image", kPng}}), FieldRefused("prompt"));
  EXPECT_THAT(ParseEditForm(Form({{"image", kPng}, {"image", kPng}, {"image", kPng}})),
              FieldRefused("image"));
  EXPECT_THAT(ParseEditForm(Form({{"n", "11"}})), FieldRefused("n"));
  EXPECT_THAT(ParseEditForm(Form({{"n", "two"}})), FieldRefused("n"));
  EXPECT_THAT(ParseEditForm(Form({{"size", "64"}})), FieldRefused("size"));
  EXPECT_THAT(ParseEditForm(Form({{"size", "0x64"}})), FieldRefused("size"));
  EXPECT_THAT(ParseEditForm(Form({{"response_format", "url"}})), FieldRefused("response_format"));
  EXPECT_THAT(ParseEditForm(Form({{"output_format", "webp"}})), FieldRefused("output_format"));
  EXPECT_THAT(ParseEditForm(Form({{"mask", kPng}})), FieldRefused("mask"));
  EXPECT_THAT(ParseEditForm(Form({{"stepz", "4"}})), FieldRefused("stepz"));
  EXPECT_THAT(ParseEditForm(Form({{"steps", "0"}})), FieldRefused("steps"));
  EXPECT_THAT(ParseEditForm(Form({{"true_cfg_scale", "-1"}})), FieldRefused("true_cfg_scale"));
  EXPECT_THAT(ParseEditForm(Form({{"timeout", "soon"}})), FieldRefused("timeout"));
  EXPECT_THAT(ParseEditForm(Form({{"prompt", "again"}})), FieldRefused("prompt"));
  EXPECT_THAT(ParseEditForm(Form({{"stream", "true"}, {"n", "2"}})), FieldRefused("n"));
  EXPECT_THAT(ParseEditForm(Form({{"stream", "maybe"}})), FieldRefused("stream"));
  EXPECT_THAT(ParseEditForm(Form({{"partial_images", "2"}})), FieldRefused("partial_images"));
  DRAY_EXPECT_OK(ParseEditForm(Form({{"partial_images", "0"}})).status());
  EXPECT_THAT(ParseEditForm(Form({{"", "x"}})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("has no name")));
}

TEST(HttpEditRequestTest, JsonCarriesTheSameFieldsWithImagesInBase64) {
  const std::string base64 = absl::Base64Escape(kPng);
  DRAY_ASSERT_OK_AND_ASSIGN(
      HttpEditRequest request,
      ParseEditJson(R"({"prompt": "make it blue", "image": ["data:image/png;base64,)" + base64 +
                    R"(", ")" + base64 + R"("], "steps": 4, "seed": 9, "stream": true,
                        "true_cfg_scale": 4, "user": null})"));
  const v1::EditImageRequest& row = request.batch.requests(0);
  EXPECT_EQ(row.image(), kPng);
  EXPECT_THAT(row.more_images(), ::testing::ElementsAre(kPng));
  EXPECT_EQ(row.num_inference_steps(), 4);
  EXPECT_EQ(row.seed(), 9);
  EXPECT_EQ(row.true_cfg_scale(), 4);
  EXPECT_TRUE(request.stream);

  DRAY_ASSERT_OK_AND_ASSIGN(request,
                            ParseEditJson(R"({"prompt": "x", "image": ")" + base64 + R"("})"));
  EXPECT_EQ(request.batch.requests(0).image(), kPng);
}

TEST(HttpEditRequestTest, JsonRefusalsNameTheFieldToo) {
  EXPECT_THAT(ParseEditJson("not json"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a JSON object")));
  EXPECT_THAT(ParseEditJson("[1, 2]"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseEditJson(R"({"prompt": "x", "image": "!!"})"), FieldRefused("image"));
  EXPECT_THAT(ParseEditJson(R"({"prompt": "x", "image": 4})"), FieldRefused("image"));
  EXPECT_THAT(ParseEditJson(R"({"prompt": "x", "image": "data:image/png,abc"})"),
              FieldRefused("image"));
  EXPECT_THAT(ParseEditJson(R"({"prompt": {"text": "x"}, "image": "AAAA"})"),
              FieldRefused("prompt"));
  const absl::StatusOr<HttpEditRequest> unknown =
      ParseEditJson(R"({"prompt": "x", "image": "AAAA", "images": ["AAAA"]})");
  EXPECT_THAT(unknown, FieldRefused("images"));
  EXPECT_THAT(unknown.status().message(), HasSubstr("unknown field"));
}

}  // namespace
}  // namespace dray
