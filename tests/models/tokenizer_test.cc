// BpeTokenizer on a tiny byte-level vocabulary (id = byte value, plus a few
// merges), with every expected id worked out by hand from Qwen2's
// pre-tokenizer rules.
#include "workers/models/bpe_tokenizer.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr int64_t kImStart = 300, kImEnd = 301, kImagePad = 302;

// TinyModel: ids 0..255 are the bytes; merges he, ll, hell, Ġw (ids 256..259).
BpeTokenizer::Model TinyModel() {
  BpeTokenizer::Model model = LearnBpeMerges("", 0);  // the 256 byte symbols, id = byte
  model.merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"\xC4\xA0", "w"}};  // "Ġ" is U+0120
  int64_t id = 256;
  for (const auto& [left, right] : model.merges) model.vocab[left + right] = id++;
  model.added_tokens = {{kImStart, "<|im_start|>", true},
                        {kImEnd, "<|im_end|>", true},
                        {kImagePad, "<|image_pad|>", true}};
  return model;
}

BpeTokenizer Tiny() { return BpeTokenizer::Build(TinyModel()).value(); }

TEST(BpeTokenizerTest, MergesInRankOrder) {
  // "hello": he (rank 0), then ll (1), then he+ll (2); " world": Ġw (3).
  EXPECT_THAT(Tiny().Encode("hello world"), ElementsAre(258, 'o', 259, 'o', 'r', 'l', 'd'));
}

TEST(BpeTokenizerTest, SpecialTokensAreCutOutFirst) {
  EXPECT_THAT(Tiny().Encode("<|im_start|>user\nhi<|im_end|>"),
              ElementsAre(kImStart, 'u', 's', 'e', 'r', '\n', 'h', 'i', kImEnd));
  EXPECT_THAT(Tiny().Encode("<|image_pad|><|image_pad|>"), ElementsAre(kImagePad, kImagePad));
  // A near miss is ordinary text.
  EXPECT_THAT(Tiny().Encode("<|im_"), ElementsAre('<', '|', 'i', 'm', '_'));
}

TEST(BpeTokenizerTest, MultilingualTextIsNfcNormalizedAndSplitLikeQwen2) {
  // "he\u0301llo" composes to "h\u00e9llo" (one letter run); " \u4e16\u754c" is a
  // letter run with its space; the space before the digits stands alone
  // (\s+(?!\S) cannot end before a digit); digits are one piece each.
  EXPECT_THAT(Tiny().Encode("he\xCC\x81llo \xE4\xB8\x96\xE7\x95\x8C 123"),
              ElementsAre('h', 0xC3, 0xA9, 257, 'o', ' ', 0xE4, 0xB8, 0x96, 0xE7, 0x95, 0x8C, ' ',
                          '1', '2', '3'));
}

TEST(BpeTokenizerTest, ContractionsWhitespaceAndNewlines) {
  // "'M" matches the case-insensitive contraction; "a  b" keeps one space
  // before " b"; "\n\n" is one piece.
  EXPECT_THAT(Tiny().Encode("I'M"), ElementsAre('I', '\'', 'M'));
  EXPECT_THAT(Tiny().Encode("a  b\n\nwe"), ElementsAre('a', ' ', ' ', 'b', '\n', '\n', 'w', 'e'));
  EXPECT_THAT(Tiny().Encode(" we"), ElementsAre(259, 'e'));
}

TEST(BpeTokenizerTest, InvalidUtf8BecomesBytesAndRoundTrips) {
  const std::string text =
      "a\xFF"
      "b\xC3";  // a stray byte and a truncated sequence
  const std::vector<int64_t> ids = Tiny().Encode(text);
  EXPECT_THAT(ids, ElementsAre('a', 0xFF, 'b', 0xC3));
  EXPECT_EQ(Tiny().Decode(ids), text);
}

TEST(BpeTokenizerTest, DecodeInvertsEncode) {
  const BpeTokenizer tokenizer = Tiny();
  const std::string text =
      "<|im_start|>Hello, w\xC3\xB6rld! \xE4\xB8\x96\xE7\x95\x8C\n\t 42 \xF0\x9F\x98\x80<|im_end|>";
  EXPECT_EQ(tokenizer.Decode(tokenizer.Encode(text)), text);
  EXPECT_EQ(tokenizer.Decode(tokenizer.Encode("<|im_start|>hi"), /*skip_special=*/true), "hi");
}

TEST(BpeTokenizerTest, TokenIdsAndVocabSize) {
  EXPECT_EQ(Tiny().TokenId("<|image_pad|>").value(), kImagePad);
  EXPECT_EQ(Tiny().TokenId("hell").value(), 258);
  EXPECT_THAT(Tiny().TokenId("<|nope|>"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("<|nope|>")));
  EXPECT_EQ(Tiny().vocab_size(), 303);
}

TEST(BpeTokenizerTest, TokenizerJsonRoundTrips) {
  const BpeTokenizer tokenizer = Tiny();
  DRAY_ASSERT_OK_AND_ASSIGN(BpeTokenizer reread,
                            BpeTokenizer::FromJson(tokenizer.ToJson(), "test"));
  const std::string text = "<|im_start|>hello world 12 \xC3\xA9<|im_end|>";
  EXPECT_EQ(reread.Encode(text), tokenizer.Encode(text));
}

TEST(BpeTokenizerTest, ReadsVocabAndMergesFiles) {
  const nlohmann::json file = nlohmann::json::parse(Tiny().ToJson());
  const fs::path dir = fs::path(std::getenv("TEST_TMPDIR")) / "vocab_merges";
  fs::create_directories(dir);
  std::ofstream(dir / "vocab.json") << file["model"]["vocab"].dump();
  std::ofstream merges(dir / "merges.txt");
  merges << "#version: 0.2\n";
  for (const auto& merge : file["model"]["merges"]) merges << merge.get<std::string>() << "\n";
  merges.close();
  nlohmann::json config = {{"added_tokens_decoder", nlohmann::json::object()}};
  for (const auto& token : file["added_tokens"]) {
    config["added_tokens_decoder"][std::to_string(token["id"].get<int64_t>())] = {
        {"content", token["content"]}, {"special", true}};
  }
  std::ofstream(dir / "tokenizer_config.json") << config.dump();

  DRAY_ASSERT_OK_AND_ASSIGN(BpeTokenizer tokenizer, BpeTokenizer::FromDirectory(dir.string()));
  const std::string text = "<|im_start|>hello world<|image_pad|>";
  EXPECT_EQ(tokenizer.Encode(text), Tiny().Encode(text));

  std::ofstream(dir / "vocab.json") << "{\"a\": 0}";
  EXPECT_THAT(
      BpeTokenizer::FromDirectory(dir.string()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lacks the symbol of byte 0")));
  EXPECT_THAT(BpeTokenizer::FromDirectory((dir / "missing").string()),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(BpeTokenizerTest, RejectsWhatItDoesNotImplement) {
  EXPECT_THAT(BpeTokenizer::FromJson("{\"normalizer\": {\"type\": \"NFKC\"}}", "t.json"),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("normalizer")));
  EXPECT_THAT(BpeTokenizer::FromJson("[1]", "t.json"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("t.json")));
  BpeTokenizer::Model model = TinyModel();
  model.merges.push_back({"x", "yz"});
  EXPECT_THAT(BpeTokenizer::Build(model),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("merge 4")));
  model = TinyModel();
  model.pattern = "(";
  EXPECT_THAT(BpeTokenizer::Build(model),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("does not compile")));
}

TEST(BpeTokenizerTest, LearnedMergesCompressTheirCorpus) {
  // Pairs tie at 3 occurrences; the smallest pair wins: el, ell, ello, hello.
  DRAY_ASSERT_OK_AND_ASSIGN(BpeTokenizer tokenizer,
                            BpeTokenizer::Build(LearnBpeMerges("hello hello hello", 4)));
  EXPECT_EQ(tokenizer.Encode("hello").size(), 1u);
  EXPECT_EQ(tokenizer.Decode(tokenizer.Encode("hello hello")), "hello hello");
}

}  // namespace
}  // namespace dray
