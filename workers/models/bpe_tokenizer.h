// BpeTokenizer: a byte-level BPE tokenizer that reads Hugging Face's
// `tokenizer.json` (or GPT-2's `vocab.json` + `merges.txt`) and encodes
// exactly as the `tokenizers` library does for Qwen2 / GPT-2 style models,
// and, with the Model's options set as clip::Tokenizer sets them, as
// transformers' CLIPTokenizer does:
//
//   1. added tokens (<|im_start|>, <|image_pad|>, ...) are cut out of the raw
//      text first, leftmost-longest, and map straight to their ids;
//   2. the rest is normalized (NFC when the file asks for it; CLIP's
//      cleaning and lowercasing) and split by the pre-tokenizer's regular
//      expression (Qwen2's pattern: contractions, letter runs, single
//      digits, punctuation runs, newlines, spaces); a piece that is an
//      added token whole (CLIP's pattern matches its two) is that token;
//   3. each piece's UTF-8 bytes become GPT-2's printable byte symbols, the
//      last one with the word-end suffix if the model has one (CLIP's
//      "</w>"), and are merged pair by pair in merge-rank order.
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
#include "workers/models/added_tokens.h"

namespace dray {

// kQwen2PreTokenizerPattern: the Split regex of Qwen2's tokenizer.json.
inline constexpr char kQwen2PreTokenizerPattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

class BpeTokenizer {
 public:
  // Normalization: what becomes of the text between added tokens before the
  // pattern splits it.
  enum class Normalization {
    kNone,
    kNfc,  // Unicode NFC
    // transformers' CLIPTokenizer without ftfy: its BasicTokenizer (NUL,
    // U+FFFD and control characters dropped, CJK ideographs set apart, NFC,
    // whitespace runs made one space and trimmed), then lowercased.
    kClip,
  };

  // A vocabulary of byte-symbol strings ("Ġthe") to ids, merges in rank order.
  struct Model {
    std::unordered_map<std::string, int64_t> vocab;
    std::vector<std::pair<std::string, std::string>> merges;
    std::vector<AddedToken> added_tokens;
    // The pre-tokenizer's regular expression (Rust regex syntax, as
    // tokenizer.json writes it).
    std::string pattern = kQwen2PreTokenizerPattern;
    // matches_only: the pattern's matches are the pieces and the text
    // between them is dropped (CLIP's re.findall); otherwise that text is a
    // piece too (a Split pre-tokenizer's "Isolated" behaviour).
    bool matches_only = false;
    Normalization normalization = Normalization::kNfc;
    // end_of_word_suffix: joined to the last byte symbol of every piece
    // before merging ("</w>" in CLIP's vocabulary); empty for none.
    std::string end_of_word_suffix;
  };

  // Build checks the model: all 256 byte symbols (and, with a word-end
  // suffix, the 256 suffixed ones) in the vocabulary, every merge's parts
  // and result in it, ids unique, the pattern compiles.
  static absl::StatusOr<BpeTokenizer> Build(Model model);
  // FromJson reads the text of a tokenizer.json; `name` prefixes errors.
  // Only what dray implements is accepted (BPE model; NFC or no normalizer;
  // a Split regex followed by a regex-free ByteLevel, or a ByteLevel with
  // its GPT-2 regex; no byte fallback, dropout or word affixes).
  static absl::StatusOr<BpeTokenizer> FromJson(absl::string_view json, const std::string& name);
  // FromDirectory reads `dir`/tokenizer.json, or else the files of
  // ReadVocabFiles.
  static absl::StatusOr<BpeTokenizer> FromDirectory(const std::string& dir);
  // ReadVocabFiles reads GPT-2's files in `dir`: vocab.json, merges.txt
  // and the added tokens of tokenizer_config.json (when present); the
  // Model's other fields keep their defaults (Qwen2's). NOT_FOUND without
  // vocab.json or merges.txt, INVALID_ARGUMENT for a malformed file.
  static absl::StatusOr<Model> ReadVocabFiles(const std::string& dir);

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer();

  // Encode tokenizes `text` as `tokenizers` does: added tokens first (so
  // "<|im_end|>" in it is that control token), then BPE between them.
  std::vector<int64_t> Encode(absl::string_view text) const;
  // EncodeText tokenizes `text` as plain text: added tokens in it are not
  // matched, so text from users cannot inject control tokens (unless the
  // pattern matches one whole, as CLIP's does).
  std::vector<int64_t> EncodeText(absl::string_view text) const;
  // Decode joins the tokens' bytes, a space for each word-end suffix; ids
  // outside the vocabulary are skipped and special tokens too when
  // `skip_special`.
  std::string Decode(absl::Span<const int64_t> ids, bool skip_special = false) const;
  // TokenId returns the id of a vocabulary or added token, NOT_FOUND naming it.
  absl::StatusOr<int64_t> TokenId(absl::string_view token) const;
  // vocab_size: one more than the largest id.
  int64_t vocab_size() const;
  const Model& model() const;

  // ToJson writes a tokenizer.json that `tokenizers` and FromJson both read,
  // for Qwen2 / GPT-2 style models (CLIP's options have no tokenizer.json
  // form here: write its vocab.json and merges.txt).
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
