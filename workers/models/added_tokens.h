// Added tokens: the special tokens (<|endoftext|>, </s>, <extra_id_0>, ...)
// that Hugging Face tokenizers cut out of the raw text, verbatim, before any
// normalization or sub-word model sees it, and what a transformers
// tokenizer_config.json says of them and of the special tokens. Shared by
// dray's tokenizers (BpeTokenizer, clip::Tokenizer, t5::Tokenizer).
//
//   DRAY_ASSIGN_OR_RETURN(nlohmann::json config, ReadTokenizerConfig(dir));
//   DRAY_ASSIGN_OR_RETURN(std::vector<AddedToken> added, ReadAddedTokensDecoder(config, dir));
//   for (const TextOrToken& part : SplitOnAddedTokens(text, added)) {
//     if (part.token != nullptr) ids.push_back(part.token->id); else EncodePlain(part.text);
//   }
//
// Thread-safety: stateless functions.
#ifndef DRAY_WORKERS_MODELS_ADDED_TOKENS_H_
#define DRAY_WORKERS_MODELS_ADDED_TOKENS_H_

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace dray {

// AddedToken: a token matched verbatim before pre-tokenization.
struct AddedToken {
  int64_t id = 0;
  std::string content;
  bool special = true;
  bool lstrip = false;  // whitespace right before the token is dropped
  bool rstrip = false;  // whitespace right after the token is dropped
};

// TextOrToken: one part of a text split on added tokens: an added token
// (`token` set) or the text between two (`token` null).
struct TextOrToken {
  absl::string_view text;
  const AddedToken* token = nullptr;
};

// SplitOnAddedTokens cuts `text` at the added tokens in it as transformers'
// tokenizers do: leftmost match first, the longest one where several start
// there. Whitespace next to a token with lstrip / rstrip (Python's
// str.isspace) is dropped, and so are empty texts. Parts point into `text`
// and `tokens`.
std::vector<TextOrToken> SplitOnAddedTokens(absl::string_view text,
                                            absl::Span<const AddedToken> tokens);

// ReadTokenizerConfig reads `dir`/tokenizer_config.json: an empty object
// when there is none, INVALID_ARGUMENT when it is not a JSON object.
absl::StatusOr<nlohmann::json> ReadTokenizerConfig(const std::string& dir);

// SpecialToken returns the text of the special token `key` ("eos_token")
// of a tokenizer_config.json, written as a string or as an AddedToken
// object's "content"; `fallback` when absent or null. `name` prefixes errors.
absl::StatusOr<std::string> SpecialToken(const nlohmann::json& config, const char* key,
                                         const std::string& fallback, const std::string& name);

// ReadAddedToken reads one added token as tokenizer.json lists them
// ({"id", "content", "special", "lstrip", "rstrip", "single_word", ...});
// `name` prefixes errors. single_word tokens are UNIMPLEMENTED.
absl::StatusOr<AddedToken> ReadAddedToken(const nlohmann::json& token, const std::string& name);

// ReadAddedTokensDecoder reads the "added_tokens_decoder" object of a
// transformers tokenizer_config.json ({"id": {"content", "special",
// "lstrip", "rstrip", ...}}) as ReadAddedToken does, empty when absent.
absl::StatusOr<std::vector<AddedToken>> ReadAddedTokensDecoder(const nlohmann::json& config,
                                                               const std::string& name);

}  // namespace dray

#endif  // DRAY_WORKERS_MODELS_ADDED_TOKENS_H_
