// t5::Tokenizer: FLUX.1's second tokenizer, transformers' T5Tokenizer with
// legacy=True (the SentencePiece one that FLUX's T5TokenizerFast stands
// for), over a diffusers `tokenizer_2/` folder (spiece.model,
// tokenizer_config.json): added tokens (</s>, <pad>, <extra_id_N>) are cut
// out first, with the whitespace next to an <extra_id_N>; each text between
// them is encoded by the SentencePiece model on its own; </s> ends the ids
// (unless the text already did) and <pad> fills them up to the length asked.
//
//   DRAY_ASSIGN_OR_RETURN(t5::Tokenizer tokenizer,
//                         t5::Tokenizer::FromDirectory(model_dir + "/tokenizer_2"));
//   DRAY_ASSIGN_OR_RETURN(std::vector<int64_t> ids, tokenizer.Encode(prompt, 512));
//
// Thread-safety: immutable after loading; its methods may run on many
// threads at once.
#ifndef DRAY_WORKERS_MODELS_T5_TOKENIZER_H_
#define DRAY_WORKERS_MODELS_T5_TOKENIZER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "workers/models/added_tokens.h"
#include "workers/models/t5/sentencepiece.h"

namespace dray::t5 {

class Tokenizer {
 public:
  // Token: one token of a text, as T5Tokenizer.tokenize writes it ("▁the",
  // "<extra_id_0>"), and its id.
  using Token = SentencePiece::Piece;

  // FromDirectory reads `dir`/spiece.model and `dir`/tokenizer_config.json:
  // its added_tokens_decoder (or else `extra_ids` <extra_id_N> at the top
  // of the vocabulary), eos_token and pad_token. NOT_FOUND without
  // spiece.model, INVALID_ARGUMENT for malformed files, UNIMPLEMENTED for
  // legacy=false.
  static absl::StatusOr<Tokenizer> FromDirectory(const std::string& dir);

  // Tokenize returns the tokens of `text`, without </s>.
  std::vector<Token> Tokenize(absl::string_view text) const;
  // Encode returns the ids FluxPipeline gives T5EncoderModel,
  // tokenizer(text, padding="max_length", max_length, truncation=True):
  // the first max_length - 1 ids of the text, </s> unless the last is one,
  // <pad> up to max_length. INVALID_ARGUMENT for max_length < 1.
  absl::StatusOr<std::vector<int64_t>> Encode(absl::string_view text, int64_t max_length) const;
  // EncodeUnpadded returns all ids of the text and </s> (padding="longest"
  // for one text).
  std::vector<int64_t> EncodeUnpadded(absl::string_view text) const;

  int64_t eos_id() const { return eos_id_; }
  int64_t pad_id() const { return pad_id_; }

 private:
  Tokenizer(SentencePiece model, std::vector<AddedToken> added);
  // FindId returns the id of a token's text: an added token's, else the
  // model's piece's, if either has it.
  std::optional<int64_t> FindId(absl::string_view text) const;
  std::vector<int64_t> Ids(absl::string_view text, size_t max_size) const;

  SentencePiece model_;
  std::vector<AddedToken> added_;
  int64_t eos_id_ = 0;
  int64_t pad_id_ = 0;
};

}  // namespace dray::t5

#endif  // DRAY_WORKERS_MODELS_T5_TOKENIZER_H_
