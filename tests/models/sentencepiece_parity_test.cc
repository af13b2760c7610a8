// dray's own SentencePiece against Debian's libsentencepiece 0.1.97 on
// FLUX.1 Kontext's T5 model (tests/data/reference/flux_kontext): the same
// pieces and ids for texts that exercise the nmt_nfkc character map
// (full-width forms, ligatures, compatibility characters, combining marks),
// whitespace of every kind, control and zero-width characters, unknown
// characters and bytes that are not UTF-8, and for random mixtures of them.
// This process links no gRPC (see sentencepiece_reference.h).
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/models/reference.h"
#include "tests/models/sentencepiece_reference.h"
#include "workers/models/t5/sentencepiece.h"

namespace dray {
namespace {

std::string ModelPath() { return ReferenceDir("flux_kontext") + "/model/tokenizer_2/spiece.model"; }

std::vector<std::pair<std::string, int>> Encode(const t5::SentencePiece& model,
                                                const std::string& text) {
  std::vector<std::pair<std::string, int>> pieces;
  for (const t5::SentencePiece::Piece& piece : model.Encode(text)) {
    pieces.emplace_back(piece.text, static_cast<int>(piece.id));
  }
  return pieces;
}

// kParts: characters and bytes that texts are made of.
const std::vector<std::string> kParts = {
    "a",
    "e",
    "the",
    "word",
    "hat",
    "Make",
    "ZOOM",
    "qqq",
    "0",
    "42",
    "-",
    "--",
    ".",
    ",",
    "!",
    "'s",
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "\v",
    "\xC2\xA0",      // no-break space
    "\xE3\x80\x80",  // ideographic space
    "\xE2\x80\x89",  // thin space
    "\xE2\x96\x81",  // ▁ itself
    "\x01",
    "\x7F",
    "\xC2\x85",
    "\xE2\x80\x8B",
    "\xE2\x80\x8D",
    "\xEF\xBB\xBF",  // controls, ZW
    "\xC2\xAD",      // soft hyphen
    "\xEF\xBC\xA1\xEF\xBC\xA2",
    "\xEF\xBC\x91\xEF\xBC\x92",  // ＡＢ １２
    "\xEF\xAC\x81",              // ﬁ
    "\xE2\x91\xA0",
    "\xE3\x8E\x8F",
    "\xE2\x84\xA2",
    "\xC2\xBD",
    "\xE2\x85\xA2",  // ① ㎏ ™ ½ Ⅲ
    "\xC3\xA9",
    "e\xCC\x81",
    "\xC3\xB1",
    "\xC3\xBC",
    "\xCC\x88",  // é é ñ ü ̈
    "\xCE\xB1\xCE\xB2",
    "\xD0\xB6",
    "\xEA\xB0\x80",
    "\xE1\x84\x80\xE1\x85\xA1",  // αβ ж 가 가
    "\xE4\xB8\x96\xE7\x95\x8C",
    "\xEF\xBD\xB6\xEF\xBE\x9E",  // 世界 ｶﾞ
    "\xF0\x9F\x98\x80",
    "\xD8\xB3\xD9\x84\xD8\xA7\xD9\x85",
    "\xE2\x80\x8F",  // 😀 سلام RLM
    std::string(1, '\0'),
    "\xFF",
    "\xC3",
    "\xED\xA0\x80",
    "\xF4\x90\x80\x80",  // not UTF-8
};

TEST(SentencePieceParityTest, MatchesLibsentencepiece) {
  const ReferenceSentencePiece reference(ModelPath());
  ASSERT_TRUE(reference.ok()) << ModelPath();
  ASSERT_EQ(reference.Encode("Make").size(), 4u);  // ▁ M a ke
  DRAY_ASSERT_OK_AND_ASSIGN(t5::SentencePiece model, t5::SentencePiece::FromFile(ModelPath()));
  std::vector<std::string> texts = {"",
                                    " ",
                                    "   ",
                                    "Make the sky blue and add a red hat.",
                                    "  multiple   spaces\tand\nnewlines ",
                                    "caf\xC3\xA9"};
  for (const std::string& part : kParts) texts.push_back(part);
  std::mt19937 random(7);
  for (int i = 0; i < 3000; ++i) {
    std::string text;
    for (int n = 1 + random() % 10; n > 0; --n) text += kParts[random() % kParts.size()];
    texts.push_back(text);
  }
  for (const std::string& text : texts) {
    ASSERT_EQ(Encode(model, text), reference.Encode(text)) << "text: '" << text << "'";
  }
}

TEST(SentencePieceParityTest, PieceIds) {
  DRAY_ASSERT_OK_AND_ASSIGN(t5::SentencePiece model, t5::SentencePiece::FromFile(ModelPath()));
  EXPECT_EQ(model.size(), 133);
  EXPECT_EQ(model.unk_id(), 2);
  EXPECT_EQ(model.PieceToId("</s>"), 1);
  EXPECT_EQ(model.PieceToId("\xE2\x96\x81the"), 5);
  EXPECT_EQ(model.PieceToId("nope"), 2);
  EXPECT_EQ(model.FindPiece("nope"), std::nullopt);
}

}  // namespace
}  // namespace dray
