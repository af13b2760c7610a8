#include "workers/models/added_tokens.h"

#include <algorithm>
#include <filesystem>

#include <unicode/uchar.h>
#include <unicode/utf8.h>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status_macros.h"

namespace dray {
namespace {

using nlohmann::json;

// IsPythonSpace is Python's str.isspace for one character: Unicode
// White_Space and the information separators U+001C..U+001F.
bool IsPythonSpace(UChar32 c) { return u_isUWhiteSpace(c) || (c >= 0x1C && c <= 0x1F); }

absl::string_view LStrip(absl::string_view text) {
  const int32_t length = static_cast<int32_t>(text.size());
  int32_t start = 0;
  while (start < length) {
    int32_t next = start;
    UChar32 c;
    U8_NEXT(text.data(), next, length, c);
    if (c < 0 || !IsPythonSpace(c)) break;
    start = next;
  }
  return text.substr(start);
}

absl::string_view RStrip(absl::string_view text) {
  int32_t end = static_cast<int32_t>(text.size());
  while (end > 0) {
    int32_t previous = end;
    UChar32 c;
    U8_PREV(text.data(), 0, previous, c);
    if (c < 0 || !IsPythonSpace(c)) break;
    end = previous;
  }
  return text.substr(0, end);
}

// LongestAt returns the longest of `tokens` that `text` has at `pos`, or null.
const AddedToken* LongestAt(absl::string_view text, size_t pos,
                            absl::Span<const AddedToken> tokens) {
  const AddedToken* longest = nullptr;
  for (const AddedToken& token : tokens) {
    const size_t size = token.content.size();
    if (size > 0 && (longest == nullptr || size > longest->content.size()) &&
        text.compare(pos, size, token.content) == 0) {
      longest = &token;
    }
  }
  return longest;
}

}  // namespace

std::vector<TextOrToken> SplitOnAddedTokens(absl::string_view text,
                                            absl::Span<const AddedToken> tokens) {
  std::vector<TextOrToken> parts;
  size_t done = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* token = LongestAt(text, i, tokens);
    if (token == nullptr) {
      ++i;
      continue;
    }
    parts.push_back({text.substr(done, i - done)});
    parts.push_back({token->content, token});
    i += token->content.size();
    done = i;
  }
  parts.push_back({text.substr(done)});
  for (size_t i = 1; i + 1 < parts.size(); i += 2) {  // tokens sit at odd positions
    if (parts[i].token->lstrip) parts[i - 1].text = RStrip(parts[i - 1].text);
    if (parts[i].token->rstrip) parts[i + 1].text = LStrip(parts[i + 1].text);
  }
  parts.erase(std::remove_if(parts.begin(), parts.end(),
                             [](const TextOrToken& part) {
                               return part.token == nullptr && part.text.empty();
                             }),
              parts.end());
  return parts;
}

absl::StatusOr<json> ReadTokenizerConfig(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "tokenizer_config.json").string();
  if (!std::filesystem::exists(path)) return json::object();
  DRAY_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  json config = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object())
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a JSON object"));
  return config;
}

absl::StatusOr<std::string> SpecialToken(const json& config, const char* key,
                                         const std::string& fallback, const std::string& name) {
  const json& token = config.contains(key) ? config[key] : json();
  if (token.is_null()) return fallback;
  if (token.is_string()) return token.get<std::string>();
  if (token.is_object() && token.contains("content") && token["content"].is_string())
    return token["content"].get<std::string>();
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": \"", key, "\" is not a token: ", token.dump()));
}

absl::StatusOr<AddedToken> ReadAddedToken(const json& token, const std::string& name) {
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(name, ": bad added token ", token.dump()));
  };
  if (!token.is_object() || !token.contains("id") || !token["id"].is_number_integer() ||
      !token.contains("content") || !token["content"].is_string()) {
    return bad();
  }
  try {
    if (token.value("single_word", false)) {
      return absl::UnimplementedError(absl::StrCat(name, ": added token option single_word ",
                                                   token.dump(), " is not supported"));
    }
    return AddedToken{token["id"].get<int64_t>(), token["content"].get<std::string>(),
                      token.value("special", false), token.value("lstrip", false),
                      token.value("rstrip", false)};
  } catch (const json::exception&) {
    return bad();
  }
}

absl::StatusOr<std::vector<AddedToken>> ReadAddedTokensDecoder(const json& config,
                                                               const std::string& name) {
  std::vector<AddedToken> tokens;
  if (!config.is_object() || !config.contains("added_tokens_decoder")) return tokens;
  const json& decoder = config["added_tokens_decoder"];
  if (!decoder.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": \"added_tokens_decoder\" is not an object"));
  }
  for (const auto& [id, token] : decoder.items()) {
    int64_t number = 0;
    if (!absl::SimpleAtoi(id, &number) || !token.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": bad added token '", id, "': ", token.dump()));
    }
    json entry = token;
    entry["id"] = number;
    DRAY_ASSIGN_OR_RETURN(AddedToken added, ReadAddedToken(entry, name));
    tokens.push_back(std::move(added));
  }
  return tokens;
}

}  // namespace dray
