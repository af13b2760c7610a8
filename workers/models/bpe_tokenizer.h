// BpeTokenizer: a byte-level BPE tokenizer that reads Hugging Face's
// `tokenizer.json` (or GPT-2's `vocab.json` + `merges.txt`) and encodes
// exactly as the `tokenizers` library does for Qwen2 / GPT-2 style models:
//
//   1. added tokens (<|im_start|>, <|image_pad|>, ...) are cut out of the raw
//      text first, leftmost-longest, and map straight to their ids;
//   2. the rest is NFC-normalized (when the file asks for it) and split by
//      the pre-tokenizer's regular expression (Qwen2's pattern: contractions,
//      letter runs, single digits, punctuation runs, newlines, spaces);
//   3. each piece's UTF-8 bytes become GPT-2's printable byte symbols and are
//      merged pair by pair in merge-rank order.
//
// Any byte string encodes: bytes that are not valid UTF-8 skip normalization
// and the regular expression and become pieces of their own, so no input
// fails and decoding gives back the exact bytes.
//
//   DRAY_ASSIGN_OR_RETURN(BpeTokenizer tokenizer, BpeTokenizer::FromDirectory("model/tokenizer"));
//   std::vector<int64_t> ids = tokenizer.Encode("<|im_start|>user\nhello<|im_end|>");
//   std::string text = tokenizer.Decode(ids);
//
// Thread-safety: immutable after loading; Encode and Decode may run on many
// threads at once.
#ifndef DRAY_WORKERS_MODELS_BPE_TOKENIZER_H_
#define DRAY_WORKERS_MODELS_BPE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace dray {

// kQwen2PreTokenizerPattern: the Split regex of Qwen2's tokenizer.json.
inline constexpr char kQwen2PreTokenizerPattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// AddedToken: a token matched verbatim before pre-tokenization.
struct AddedToken {
  int64_t id = 0;
  std::string content;
  bool special = true;
};

class BpeTokenizer {
 public:
  // A vocabulary of byte-symbol strings ("Ġthe") to ids, merges in rank order.
  struct Model {
    std::unordered_map<std::string, int64_t> vocab;
    std::vector<std::pair<std::string, std::string>> merges;
    std::vector<AddedToken> added_tokens;
    std::string pattern = kQwen2PreTokenizerPattern;
    bool nfc = true;
  };

  // Build checks the model: all 256 byte symbols in the vocabulary, every
  // merge's parts and result in it, ids unique, the pattern compiles.
  static absl::StatusOr<BpeTokenizer> Build(Model model);
  // FromJson reads the text of a tokenizer.json; `name` prefixes errors.
  // Only what dray implements is accepted (BPE model; NFC or no normalizer;
  // a Split regex followed by a regex-free ByteLevel, or a ByteLevel with
  // its GPT-2 regex; no byte fallback, dropout or word affixes).
  static absl::StatusOr<BpeTokenizer> FromJson(absl::string_view json, const std::string& name);
  // FromDirectory reads `dir`/tokenizer.json, or else `dir`/vocab.json and
  // `dir`/merges.txt with the added tokens of tokenizer_config.json.
  static absl::StatusOr<BpeTokenizer> FromDirectory(const std::string& dir);

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer();

  // Encode tokenizes `text` as `tokenizers` does: added tokens first (so
  // "<|im_end|>" in it is that control token), then BPE between them.
  std::vector<int64_t> Encode(absl::string_view text) const;
  // EncodeText tokenizes `text` as plain text: added tokens in it are not
  // matched, so text from users cannot inject control tokens.
  std::vector<int64_t> EncodeText(absl::string_view text) const;
  // Decode joins the tokens' bytes; ids outside the vocabulary are skipped
  // and special tokens too when `skip_special`.
  std::string Decode(absl::Span<const int64_t> ids, bool skip_special = false) const;
  // TokenId returns the id of a vocabulary or added token, NOT_FOUND naming it.
  absl::StatusOr<int64_t> TokenId(absl::string_view token) const;
  // vocab_size: one more than the largest id.
  int64_t vocab_size() const;
  const Model& model() const;

  // ToJson writes a tokenizer.json that `tokenizers` and FromJson both read.
  std::string ToJson() const;
  // The files transformers' Python tokenizers read, as its save_pretrained
  // writes them: vocab.json (the BPE vocabulary without added tokens),
  // merges.txt and added_tokens.json.
  std::string VocabJson() const;
  std::string MergesTxt() const;
  std::string AddedTokensJson() const;

 private:
  struct State;
  explicit BpeTokenizer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// LearnBpeMerges learns `num_merges` merges from `corpus` the way BPE
// training does (most frequent adjacent pair first, ties broken by the
// pair's symbols), for writing small tokenizers; returns the byte-symbol
// vocabulary plus one token per merge, and the merges.
BpeTokenizer::Model LearnBpeMerges(absl::string_view corpus, int num_merges);

}  // namespace dray

#endif  // DRAY_WORKERS_MODELS_BPE_TOKENIZER_H_
