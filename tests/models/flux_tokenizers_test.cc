// FLUX.1's tokenizers against transformers' own: clip::Tokenizer as the
// pure-Python CLIPTokenizer and t5::Tokenizer as T5Tokenizer(legacy=True)
// encoded every prompt of tests/data/reference/flux_kontext/tokenizers
// (see its README), in every call form FluxKontextPipeline uses; and the
// errors of a missing or malformed tokenizer folder.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "base/files.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/models/reference.h"
#include "workers/models/clip/tokenizer.h"
#include "workers/models/t5/sentencepiece.h"
#include "workers/models/t5/tokenizer.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string KontextDir(const std::string& path) {
  return ReferenceDir("flux_kontext") + "/" + path;
}

nlohmann::json Cases() {
  return nlohmann::json::parse(ReadFile(KontextDir("tokenizers/cases.json")).value())["cases"];
}

std::vector<int64_t> Ids(const nlohmann::json& json) { return json.get<std::vector<int64_t>>(); }

// Folder: a fresh folder under the test's scratch space.
fs::path Folder(const std::string& name) {
  const fs::path dir = fs::path(std::getenv("TEST_TMPDIR")) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void Write(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

TEST(ClipTokenizerTest, MatchesCLIPTokenizerOnEveryPrompt) {
  DRAY_ASSERT_OK_AND_ASSIGN(clip::Tokenizer tokenizer,
                            clip::Tokenizer::FromDirectory(KontextDir("model/tokenizer")));
  std::map<int64_t, std::string> tokens;
  for (const auto& [token, id] : tokenizer.bpe().model().vocab) tokens[id] = token;
  for (const nlohmann::json& c : Cases()) {
    const std::string prompt = c["prompt"];
    SCOPED_TRACE(prompt);
    std::vector<std::string> texts;
    for (int64_t id : tokenizer.bpe().Encode(prompt)) texts.push_back(tokens[id]);
    EXPECT_EQ(texts, c["clip_tokens"].get<std::vector<std::string>>());
    EXPECT_EQ(tokenizer.Encode(prompt, 77).value(), Ids(c["clip_ids_max_length_77"]));
    EXPECT_EQ(tokenizer.EncodeUnpadded(prompt), Ids(c["clip_ids_longest"]));
  }
}

TEST(ClipTokenizerTest, SpecialTokensAndTheirText) {
  DRAY_ASSERT_OK_AND_ASSIGN(clip::Tokenizer tokenizer,
                            clip::Tokenizer::FromDirectory(KontextDir("model/tokenizer")));
  const std::vector<int64_t> hat = tokenizer.bpe().Encode("hat");
  ASSERT_THAT(hat, ElementsAre(550));
  // Cut out verbatim; in other case the pattern still matches it whole once
  // lowercased, and CLIP's BPE gives it back unmerged.
  EXPECT_THAT(tokenizer.bpe().Encode("hat<|endoftext|>"), ElementsAre(550, 713));
  EXPECT_THAT(tokenizer.bpe().Encode("HAT <|EndOfText|>"), ElementsAre(550, 713));
  // Control characters go, whitespace of any kind separates words.
  EXPECT_EQ(tokenizer.bpe().Encode("h\x01"
                                   "at\xE3\x80\x80hat\t"),
            tokenizer.bpe().Encode("hat hat"));
  EXPECT_EQ(tokenizer.bpe().Decode(tokenizer.bpe().Encode("Red hat.")), "red hat . ");
  EXPECT_THAT(tokenizer.Encode("hat", 1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(tokenizer.Encode("hat hat", 3).value(), ElementsAre(712, 550, 713));
}

TEST(T5TokenizerTest, MatchesT5TokenizerOnEveryPrompt) {
  DRAY_ASSERT_OK_AND_ASSIGN(t5::Tokenizer tokenizer,
                            t5::Tokenizer::FromDirectory(KontextDir("model/tokenizer_2")));
  for (const nlohmann::json& c : Cases()) {
    const std::string prompt = c["prompt"];
    SCOPED_TRACE(prompt);
    std::vector<std::string> pieces;
    for (const t5::Tokenizer::Token& token : tokenizer.Tokenize(prompt))
      pieces.push_back(token.text);
    EXPECT_EQ(pieces, c["t5_pieces"].get<std::vector<std::string>>());
    EXPECT_EQ(tokenizer.Encode(prompt, 32).value(), Ids(c["t5_ids_max_length_32"]));
    EXPECT_EQ(tokenizer.Encode(prompt, 512).value(), Ids(c["t5_ids_max_length_512"]));
    EXPECT_EQ(tokenizer.EncodeUnpadded(prompt), Ids(c["t5_ids_longest"]));
  }
}

std::vector<int64_t> TokenIds(const t5::Tokenizer& tokenizer, const std::string& text) {
  std::vector<int64_t> ids;
  for (const t5::Tokenizer::Token& token : tokenizer.Tokenize(text)) ids.push_back(token.id);
  return ids;
}

TEST(T5TokenizerTest, AddedTokensAndEos) {
  DRAY_ASSERT_OK_AND_ASSIGN(t5::Tokenizer tokenizer,
                            t5::Tokenizer::FromDirectory(KontextDir("model/tokenizer_2")));
  // <extra_id_N> is 232 - N and takes the whitespace around it; the texts
  // on either side are encoded apart.
  std::vector<int64_t> expected = TokenIds(tokenizer, "red hat");
  expected.push_back(232);
  for (int64_t id : TokenIds(tokenizer, "blue")) expected.push_back(id);
  EXPECT_EQ(TokenIds(tokenizer, "red hat \t<extra_id_0>  blue"), expected);
  EXPECT_THAT(TokenIds(tokenizer, "<extra_id_99><pad><unk>"), ElementsAre(133, 0, 2));
  // A text that ends in </s> gets no second one, even when truncated to it.
  EXPECT_THAT(tokenizer.EncodeUnpadded("</s>"), ElementsAre(1));
  EXPECT_THAT(tokenizer.Encode("the</s>the", 3).value(), ElementsAre(5, 1, 0));
  EXPECT_THAT(tokenizer.Encode("the", 1).value(), ElementsAre(1));
  EXPECT_THAT(tokenizer.Encode("the", 0), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(T5TokenizerTest, ConfigWithoutAddedTokensGetsT5Defaults) {
  const fs::path dir = Folder("t5_defaults");
  fs::copy_file(KontextDir("model/tokenizer_2/spiece.model"), dir / "spiece.model");
  DRAY_ASSERT_OK_AND_ASSIGN(t5::Tokenizer tokenizer, t5::Tokenizer::FromDirectory(dir.string()));
  DRAY_ASSERT_OK_AND_ASSIGN(t5::Tokenizer reference,
                            t5::Tokenizer::FromDirectory(KontextDir("model/tokenizer_2")));
  const std::string text = "Add a hat <extra_id_0> and <extra_id_99></s>";
  EXPECT_EQ(tokenizer.EncodeUnpadded(text), reference.EncodeUnpadded(text));
}

TEST(FluxTokenizersTest, MissingOrMalformedFolders) {
  const std::string missing = (fs::path(std::getenv("TEST_TMPDIR")) / "missing").string();
  EXPECT_THAT(clip::Tokenizer::FromDirectory(missing),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("vocab.json")));
  EXPECT_THAT(t5::Tokenizer::FromDirectory(missing),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("spiece.model")));

  const fs::path clip_dir = Folder("clip_malformed");
  for (const char* file : {"vocab.json", "merges.txt", "tokenizer_config.json"})
    fs::copy_file(KontextDir("model/tokenizer/") + file, clip_dir / file);
  Write(clip_dir / "tokenizer_config.json", "{\"bos_token\": \"<|nope|>\"}");
  EXPECT_THAT(clip::Tokenizer::FromDirectory(clip_dir.string()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("<|nope|>")));
  Write(clip_dir / "tokenizer_config.json", "[");
  EXPECT_THAT(clip::Tokenizer::FromDirectory(clip_dir.string()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokenizer_config.json")));
  Write(clip_dir / "tokenizer_config.json", "{}");
  Write(clip_dir / "vocab.json", "{\"a\": 0}");
  EXPECT_THAT(clip::Tokenizer::FromDirectory(clip_dir.string()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lacks the symbol of byte")));

  const fs::path t5_dir = Folder("t5_malformed");
  Write(t5_dir / "spiece.model", "not a model");
  EXPECT_THAT(t5::Tokenizer::FromDirectory(t5_dir.string()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("spiece.model")));
  fs::remove(t5_dir / "spiece.model");
  fs::copy_file(KontextDir("model/tokenizer_2/spiece.model"), t5_dir / "spiece.model");
  Write(t5_dir / "tokenizer_config.json", "{\"legacy\": false}");
  EXPECT_THAT(t5::Tokenizer::FromDirectory(t5_dir.string()),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("legacy")));
  Write(t5_dir / "tokenizer_config.json", "{\"added_tokens_decoder\": {\"x\": {}}}");
  EXPECT_THAT(t5::Tokenizer::FromDirectory(t5_dir.string()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("added token")));
  Write(t5_dir / "tokenizer_config.json", "{\"eos_token\": \"<eos>\"}");
  EXPECT_THAT(t5::Tokenizer::FromDirectory(t5_dir.string()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("<eos>")));

  // Hand-made ModelProtos (a unigram trainer spec, then a normalizer spec):
  // a character map whose trie runs past its blob, and a trainer field of
  // the wrong wire type, are malformed files, not crashes or stale values.
  const std::string unigram("\x12\x02\x18\x01", 4);
  const std::string overrun_map(
      "\x1a\x0a\x12\x08\x07\x00\x00\x00"
      "abcd",
      12);
  EXPECT_THAT(t5::SentencePiece::FromSerialized(unigram + overrun_map, "m"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("precompiled_charsmap")));
  EXPECT_THAT(t5::SentencePiece::FromSerialized(std::string("\x12\x03\x1a\x01x", 5), "m"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a SentencePiece")));
}

}  // namespace
}  // namespace dray
