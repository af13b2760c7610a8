#include "workers/models/t5/tokenizer.h"

#include <filesystem>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace dray::t5 {
namespace {

using nlohmann::json;

// DefaultAddedTokens: T5Tokenizer's added tokens where tokenizer_config.json
// lists none: its special tokens, and `extra_ids` sentinels <extra_id_N> at
// id size - 1 + extra_ids - N that take the whitespace around them.
absl::StatusOr<std::vector<AddedToken>> DefaultAddedTokens(const SentencePiece& model,
                                                           const json& config,
                                                           const std::string& name) {
  std::vector<AddedToken> added;
  for (const auto& [key, fallback] :
       {std::pair{"eos_token", "</s>"}, {"unk_token", "<unk>"}, {"pad_token", "<pad>"}}) {
    DRAY_ASSIGN_OR_RETURN(std::string text, SpecialToken(config, key, fallback, name));
    const std::optional<int64_t> id = model.FindPiece(text);
    if (id.has_value()) added.push_back({*id, text});
  }
  const json& extra_ids = config.contains("extra_ids") ? config["extra_ids"] : json(100);
  if (!extra_ids.is_number_integer() || extra_ids.get<int64_t>() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": \"extra_ids\" is not a count: ", extra_ids.dump()));
  }
  const int64_t count = extra_ids.get<int64_t>();
  for (int64_t n = 0; n < count; ++n) {
    added.push_back({model.size() - 1 + count - n, absl::StrCat("<extra_id_", n, ">"),
                     /*special=*/true, /*lstrip=*/true, /*rstrip=*/true});
  }
  return added;
}

}  // namespace

Tokenizer::Tokenizer(SentencePiece model, std::vector<AddedToken> added)
    : model_(std::move(model)), added_(std::move(added)) {}

absl::StatusOr<Tokenizer> Tokenizer::FromDirectory(const std::string& dir) {
  DRAY_ASSIGN_OR_RETURN(
      SentencePiece model,
      SentencePiece::FromFile((std::filesystem::path(dir) / "spiece.model").string()));
  DRAY_ASSIGN_OR_RETURN(json config, ReadTokenizerConfig(dir));
  const std::string name = (std::filesystem::path(dir) / "tokenizer_config.json").string();
  if (config.contains("legacy") && config["legacy"] == false) {
    return absl::UnimplementedError(absl::StrCat(
        name,
        ": legacy=false (T5Tokenizer's newer handling of text after added tokens) is not "
        "supported"));
  }
  DRAY_ASSIGN_OR_RETURN(std::vector<AddedToken> added, ReadAddedTokensDecoder(config, name));
  if (added.empty()) {
    DRAY_ASSIGN_OR_RETURN(added, DefaultAddedTokens(model, config, name));
  }
  Tokenizer tokenizer(std::move(model), std::move(added));
  auto special_id = [&](const char* key, const char* fallback) -> absl::StatusOr<int64_t> {
    DRAY_ASSIGN_OR_RETURN(std::string text, SpecialToken(config, key, fallback, name));
    const std::optional<int64_t> id = tokenizer.FindId(text);
    if (!id.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ", key, " '", text, "' is not in the vocabulary"));
    }
    return *id;
  };
  DRAY_ASSIGN_OR_RETURN(tokenizer.eos_id_, special_id("eos_token", "</s>"));
  DRAY_ASSIGN_OR_RETURN(tokenizer.pad_id_, special_id("pad_token", "<pad>"));
  return tokenizer;
}

std::vector<Tokenizer::Token> Tokenizer::Tokenize(absl::string_view text) const {
  std::vector<Token> tokens;
  for (const TextOrToken& part : SplitOnAddedTokens(text, added_)) {
    if (part.token != nullptr) {
      tokens.push_back({part.token->content, part.token->id});
      continue;
    }
    for (SentencePiece::Piece& piece : model_.Encode(part.text)) {
      piece.id = FindId(piece.text).value_or(model_.unk_id());
      tokens.push_back(std::move(piece));
    }
  }
  return tokens;
}

absl::StatusOr<std::vector<int64_t>> Tokenizer::Encode(absl::string_view text,
                                                       int64_t max_length) const {
  if (max_length < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("T5 max_length must be at least 1 (room for </s>), got ", max_length));
  }
  std::vector<int64_t> ids = Ids(text, static_cast<size_t>(max_length - 1));
  ids.resize(static_cast<size_t>(max_length), pad_id_);
  return ids;
}

std::vector<int64_t> Tokenizer::EncodeUnpadded(absl::string_view text) const {
  return Ids(text, std::numeric_limits<size_t>::max());
}

std::optional<int64_t> Tokenizer::FindId(absl::string_view text) const {
  for (const AddedToken& token : added_) {
    if (token.content == text) return token.id;
  }
  return model_.FindPiece(text);
}

// Ids: the first `max_size` ids of `text`, then </s> unless the last is one
// (T5Tokenizer's truncation leaves one place for it, then
// _add_eos_if_not_present).
std::vector<int64_t> Tokenizer::Ids(absl::string_view text, size_t max_size) const {
  std::vector<int64_t> ids;
  for (const Token& token : Tokenize(text)) ids.push_back(token.id);
  if (ids.size() > max_size) ids.resize(max_size);
  if (ids.empty() || ids.back() != eos_id_) ids.push_back(eos_id_);
  return ids;
}

}  // namespace dray::t5
