// clip::Tokenizer: FLUX.1's first tokenizer, transformers' CLIPTokenizer
// (the pure-Python one, without ftfy, as diffusers runs it where ftfy is
// not installed) over a diffusers `tokenizer/` folder (vocab.json,
// merges.txt, tokenizer_config.json): BpeTokenizer with CLIP's options
// (BasicTokenizer's cleaning and lowercasing, CLIP's pattern, "</w>" word
// ends), between <|startoftext|> and <|endoftext|>, padded with the pad
// token (<|endoftext|>).
//
//   DRAY_ASSIGN_OR_RETURN(clip::Tokenizer tokenizer,
//                         clip::Tokenizer::FromDirectory(model_dir + "/tokenizer"));
//   DRAY_ASSIGN_OR_RETURN(std::vector<int64_t> ids, tokenizer.Encode(prompt, 77));
//
// Thread-safety: immutable after loading; its methods may run on many
// threads at once.
#ifndef DRAY_WORKERS_MODELS_CLIP_TOKENIZER_H_
#define DRAY_WORKERS_MODELS_CLIP_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "workers/models/bpe_tokenizer.h"

namespace dray::clip {

class Tokenizer {
 public:
  // FromDirectory reads `dir`'s vocab.json, merges.txt (its first 48894
  // merges, as CLIPTokenizer reads them) and tokenizer_config.json (added
  // tokens; bos_token, eos_token, pad_token). NOT_FOUND without vocab.json
  // or merges.txt, INVALID_ARGUMENT for malformed files.
  static absl::StatusOr<Tokenizer> FromDirectory(const std::string& dir);

  // Encode returns the ids FluxPipeline gives CLIPTextModel,
  // tokenizer(text, padding="max_length", max_length, truncation=True):
  // <|startoftext|>, the first max_length - 2 tokens of the text,
  // <|endoftext|>, the pad token up to max_length. INVALID_ARGUMENT for
  // max_length < 2.
  absl::StatusOr<std::vector<int64_t>> Encode(absl::string_view text, int64_t max_length) const;
  // EncodeUnpadded returns <|startoftext|>, all tokens of the text and
  // <|endoftext|> (padding="longest" for one text).
  std::vector<int64_t> EncodeUnpadded(absl::string_view text) const;

  // bpe: the tokenizer of the text itself (its vocabulary names the ids).
  const BpeTokenizer& bpe() const { return bpe_; }

 private:
  explicit Tokenizer(BpeTokenizer bpe) : bpe_(std::move(bpe)) {}
  std::vector<int64_t> Ids(absl::string_view text, size_t max_size) const;

  BpeTokenizer bpe_;
  int64_t bos_id_ = 0;
  int64_t eos_id_ = 0;
  int64_t pad_id_ = 0;
};

}  // namespace dray::clip

#endif  // DRAY_WORKERS_MODELS_CLIP_TOKENIZER_H_
