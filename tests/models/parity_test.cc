// Parity with the reference implementations on every case in
// tests/data/reference/qwen_image (diffusers: scheduler schedules and Euler
// steps, pipeline helpers, transformer and VAE outputs) and
// tests/data/reference/qwen2_vl (transformers: text encoder, vision tower,
// image processor) and tests/data/reference/qwen_image_edit_plus (diffusers'
// QwenImageEditPlusPipeline: pre-processing, prompt encoding with one to
// three images, whole edits, 2511's zero_cond_t) and tests/data/reference/flux_kontext
// (diffusers' FluxKontextPipeline, transformers' CLIP and T5: every component,
// tokenizers, whole edits), run through the same library as `dray parity`,
// within the tolerances of each reference README.
#include "workers/parity/parity.h"

#include <cstdlib>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "runtime/io/safetensors.h"
#include "tests/models/reference.h"

namespace dray {

// PrintTo names a case in gtest's messages.
void PrintTo(const ParityCase& c, std::ostream* os) { *os << c.component << "/" << c.name; }

namespace {

namespace fs = std::filesystem;

void ExpectAllPass(const std::vector<ParityResult>& results) {
  ASSERT_FALSE(results.empty());
  for (const ParityResult& result : results) {
    EXPECT_TRUE(result.passed) << result.component << "/" << result.case_name << " "
                               << result.output << ": "
                               << (result.error.empty() ? "" : result.error + "; ") << "max abs "
                               << result.max_abs << ", max rel " << result.max_rel << " (atol "
                               << result.atol << ", rtol " << result.rtol << ")";
  }
}

class ParityTest : public ::testing::TestWithParam<ParityCase> {};

TEST_P(ParityTest, MatchesTheReference) {
  const std::vector<ParityResult> results = RunParityCase(GetParam());
  for (const ParityResult& result : results)
    RecordProperty(result.output, absl::StrCat(result.max_abs));
  ExpectAllPass(results);
}

std::vector<ParityCase> CasesIn(const std::string& family) {
  absl::StatusOr<std::vector<ParityCase>> cases = ListParityCases(ReferenceDir(family));
  EXPECT_TRUE(cases.ok()) << cases.status();
  return cases.value_or(std::vector<ParityCase>{});
}

std::string CaseName(const ::testing::TestParamInfo<ParityCase>& info) {
  return info.param.component + "_" + info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Diffusers, ParityTest, ::testing::ValuesIn(CasesIn("qwen_image")),
                         CaseName);
INSTANTIATE_TEST_SUITE_P(Transformers, ParityTest, ::testing::ValuesIn(CasesIn("qwen2_vl")),
                         CaseName);
INSTANTIATE_TEST_SUITE_P(EditPlus, ParityTest, ::testing::ValuesIn(CasesIn("qwen_image_edit_plus")),
                         CaseName);
INSTANTIATE_TEST_SUITE_P(FluxKontext, ParityTest, ::testing::ValuesIn(CasesIn("flux_kontext")),
                         CaseName);

std::multiset<std::string> Components(const std::vector<ParityCase>& cases) {
  std::multiset<std::string> components;
  for (const ParityCase& c : cases) components.insert(c.component);
  return components;
}

TEST(ParityListTest, FindsEveryCaseTheReadmesList) {
  const std::multiset<std::string> diffusers = Components(CasesIn("qwen_image"));
  EXPECT_EQ(diffusers.count("scheduler"), 4u + 1u);
  EXPECT_EQ(diffusers.count("helpers"), 1u);
  EXPECT_EQ(diffusers.count("transformer_tiny") + diffusers.count("transformer_small"), 2u + 5u);
  EXPECT_EQ(diffusers.count("vae_tiny") + diffusers.count("vae_default_small"), 3u + 9u);
  EXPECT_EQ(diffusers.size(), 25u);
  const std::multiset<std::string> transformers = Components(CasesIn("qwen2_vl"));
  EXPECT_EQ(transformers.count("text_encoder_tiny"), 6u);
  EXPECT_EQ(transformers.count("text_encoder_small"), 6u);
  EXPECT_EQ(transformers.count("image_processor"), 5u);
  EXPECT_EQ(transformers.size(), 17u);
  const std::multiset<std::string> edit_plus = Components(CasesIn("qwen_image_edit_plus"));
  EXPECT_EQ(edit_plus.count("edit_plus_preprocess"), 5u);
  EXPECT_EQ(edit_plus.count("edit_plus_encode_prompt"), 4u);
  EXPECT_EQ(edit_plus.count("edit_plus_e2e"), 4u);
  EXPECT_EQ(edit_plus.count("edit_e2e"), 2u);
  EXPECT_EQ(edit_plus.size(), 15u);
  const std::multiset<std::string> kontext = Components(CasesIn("flux_kontext"));
  EXPECT_EQ(kontext.count("flux_transformer"), 3u);
  EXPECT_EQ(kontext.count("flux_vae"), 2u);
  EXPECT_EQ(kontext.count("flux_text_encoders"), 2u);
  EXPECT_EQ(kontext.count("flux_kontext_e2e"), 3u);
  EXPECT_EQ(kontext.count("flux_scheduler") + kontext.count("flux_preprocess") +
                kontext.count("flux_tokenizers"),
            3u);
  EXPECT_EQ(kontext.size(), 13u);
}

// Released Qwen2.5-VL checkpoints (and transformers < 4.52) name the
// language model `model.*` and the vision tower `visual.*`; the reference
// weights, renamed so, give the same outputs.
TEST(TextEncoderParityTest, OlderTransformersWeightNamesLoadAndMatch) {
  for (const std::string config : {"tiny", "small"}) {
    SCOPED_TRACE(config);
    const fs::path source = ReferenceDir("qwen2_vl/" + config);
    const fs::path copy = fs::path(std::getenv("TEST_TMPDIR")) / "older_names" / config;
    fs::create_directories(copy);
    for (const auto& entry : fs::directory_iterator(source)) {
      if (entry.path().filename() != "model.safetensors")
        fs::copy_file(entry.path(), copy / entry.path().filename(),
                      fs::copy_options::overwrite_existing);
    }
    DRAY_ASSERT_OK_AND_ASSIGN(auto weights,
                              SafetensorsFile::Open((source / "model.safetensors").string()));
    std::vector<std::pair<std::string, at::Tensor>> renamed;
    for (const std::string& name : weights->names()) {
      std::string older = name;
      for (const std::string prefix : {"model.language_model.", "model.visual."}) {
        if (name.rfind(prefix, 0) == 0)
          older = (prefix == "model.visual." ? "visual." : "model.") + name.substr(prefix.size());
      }
      renamed.emplace_back(older, weights->Get(name).value());
    }
    DRAY_ASSERT_OK(WriteSafetensors((copy / "model.safetensors").string(), renamed));
    DRAY_ASSERT_OK_AND_ASSIGN(std::vector<ParityCase> cases, ListParityCases(copy.string()));
    EXPECT_EQ(cases.size(), 6u);
    for (const ParityCase& c : cases) ExpectAllPass(RunParityCase(c));
  }
}

}  // namespace
}  // namespace dray
