#include "workers/models/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <limits>
#include <map>
#include <sstream>

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/uregex.h>
#include <unicode/ustring.h>
#include <unicode/utext.h>
#include <unicode/utf8.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/files.h"
#include "base/status_macros.h"

namespace dray {
namespace {

using nlohmann::json;

constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string Utf8(UChar32 c) {
  char buffer[4];
  int32_t length = 0;
  U8_APPEND_UNSAFE(buffer, length, c);
  return std::string(buffer, length);
}

// ByteSymbols: GPT-2's bytes_to_unicode, each byte's printable stand-in (UTF-8).
const std::array<std::string, 256>& ByteSymbols() {
  static const std::array<std::string, 256> symbols = [] {
    std::array<std::string, 256> table;
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      table[b] = Utf8(printable ? b : next++);
    }
    return table;
  }();
  return symbols;
}

// SymbolBytes maps a byte-symbol string back to its bytes; other characters
// (added tokens are not byte-mapped) pass through as UTF-8.
std::string SymbolBytes(const std::string& token) {
  static const std::map<UChar32, char> inverse = [] {
    std::map<UChar32, char> map;
    for (int b = 0; b < 256; ++b) {
      int32_t i = 0;
      UChar32 c;
      U8_NEXT_UNSAFE(ByteSymbols()[b].data(), i, c);
      map[c] = static_cast<char>(b);
    }
    return map;
  }();
  std::string bytes;
  int32_t i = 0;
  const int32_t length = static_cast<int32_t>(token.size());
  while (i < length) {
    const int32_t start = i;
    UChar32 c;
    U8_NEXT(token.data(), i, length, c);
    auto found = inverse.find(c);
    if (found != inverse.end()) {
      bytes.push_back(found->second);
    } else {
      bytes.append(token, start, i - start);
    }
  }
  return bytes;
}

// IcuPattern rewrites a Rust-regex pattern for ICU: \s and \S mean Unicode
// White_Space there (ICU's \s is narrower).
std::string IcuPattern(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's') {
        out += "\\p{White_Space}";
      } else if (next == 'S') {
        out += "\\P{White_Space}";
      } else {
        out += '\\';
        out += next;
      }
    } else {
      out += pattern[i];
    }
  }
  return out;
}

std::u16string ToUtf16(absl::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  int32_t length = 0;
  u_strFromUTF8(nullptr, 0, &length, text.data(), static_cast<int32_t>(text.size()), &status);
  std::u16string out(length, u'\0');
  status = U_ZERO_ERROR;
  u_strFromUTF8(out.data(), length, &length, text.data(), static_cast<int32_t>(text.size()),
                &status);
  return out;
}

std::string ToUtf8(const std::u16string& text) {
  UErrorCode status = U_ZERO_ERROR;
  int32_t length = 0;
  u_strToUTF8(nullptr, 0, &length, text.data(), static_cast<int32_t>(text.size()), &status);
  std::string out(length, '\0');
  status = U_ZERO_ERROR;
  u_strToUTF8(out.data(), length, &length, text.data(), static_cast<int32_t>(text.size()), &status);
  return out;
}

// Nfc returns valid UTF-8 `text` in Normalization Form C.
std::string Nfc(absl::string_view text) {
  if (std::all_of(text.begin(), text.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
    return std::string(text);
  }
  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* nfc = unorm2_getNFCInstance(&status);
  const std::u16string utf16 = ToUtf16(text);
  if (U_FAILURE(status) || unorm2_quickCheck(nfc, utf16.data(), static_cast<int32_t>(utf16.size()),
                                             &status) == UNORM_YES) {
    return std::string(text);
  }
  status = U_ZERO_ERROR;
  int32_t length =
      unorm2_normalize(nfc, utf16.data(), static_cast<int32_t>(utf16.size()), nullptr, 0, &status);
  std::u16string normalized(length, u'\0');
  status = U_ZERO_ERROR;
  unorm2_normalize(nfc, utf16.data(), static_cast<int32_t>(utf16.size()), normalized.data(), length,
                   &status);
  return U_FAILURE(status) ? std::string(text) : ToUtf8(normalized);
}

// IsCjkIdeograph: the code points of BasicTokenizer._is_chinese_char.
bool IsCjkIdeograph(UChar32 c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// ClipClean is BasicTokenizer's _clean_text and _tokenize_chinese_chars on
// valid UTF-8: NUL, U+FFFD and control characters (general category C*,
// but tab, newline and carriage return) dropped, those three and category
// Zs made spaces, CJK ideographs set apart by spaces.
std::string ClipClean(absl::string_view text) {
  std::string out;
  const int32_t length = static_cast<int32_t>(text.size());
  for (int32_t i = 0; i < length;) {
    UChar32 c;
    U8_NEXT_UNSAFE(text.data(), i, c);
    const bool space =
        c == ' ' || c == '\t' || c == '\n' || c == '\r' || u_charType(c) == U_SPACE_SEPARATOR;
    if (c == 0xFFFD || (!space && (U_GET_GC_MASK(c) & U_GC_C_MASK) != 0)) continue;
    if (space) {
      out += ' ';
    } else if (IsCjkIdeograph(c)) {
      absl::StrAppend(&out, " ", Utf8(c), " ");
    } else {
      out += Utf8(c);
    }
  }
  return out;
}

// ClipNormalize: Normalization::kClip on valid UTF-8.
std::string ClipNormalize(absl::string_view text) {
  const std::string nfc = Nfc(ClipClean(text));
  std::string words;  // whitespace runs made one space, trimmed
  bool space = false;
  const int32_t length = static_cast<int32_t>(nfc.size());
  for (int32_t i = 0; i < length;) {
    UChar32 c;
    U8_NEXT_UNSAFE(nfc.data(), i, c);
    if (u_isUWhiteSpace(c)) {
      space = !words.empty();
      continue;
    }
    if (space) words += ' ';
    space = false;
    words += Utf8(c);
  }
  const std::u16string utf16 = ToUtf16(words);
  UErrorCode status = U_ZERO_ERROR;
  const int32_t size =
      u_strToLower(nullptr, 0, utf16.data(), static_cast<int32_t>(utf16.size()), "", &status);
  std::u16string lower(size, u'\0');
  status = U_ZERO_ERROR;
  u_strToLower(lower.data(), size, utf16.data(), static_cast<int32_t>(utf16.size()), "", &status);
  return ToUtf8(lower);
}

// ValidUtf8Prefix returns how many leading bytes of `text` are valid UTF-8.
size_t ValidUtf8Prefix(absl::string_view text) {
  int32_t i = 0;
  const int32_t length = static_cast<int32_t>(text.size());
  while (i < length) {
    const int32_t start = i;
    UChar32 c;
    U8_NEXT(text.data(), i, length, c);
    if (c < 0) return start;
  }
  return text.size();
}

struct RegexDeleter {
  void operator()(URegularExpression* regex) const { uregex_close(regex); }
};
using Regex = std::unique_ptr<URegularExpression, RegexDeleter>;

// CompilePattern compiles a pre-tokenizer pattern written for Rust's regex.
absl::StatusOr<Regex> CompilePattern(const std::string& rust_pattern) {
  const std::u16string pattern = ToUtf16(IcuPattern(rust_pattern));
  UErrorCode status = U_ZERO_ERROR;
  UParseError error;
  Regex regex(uregex_open(reinterpret_cast<const UChar*>(pattern.data()),
                          static_cast<int32_t>(pattern.size()), 0, &error, &status));
  if (U_FAILURE(status)) {
    return absl::InvalidArgumentError(absl::StrCat("pre-tokenizer pattern does not compile (",
                                                   u_errorName(status), " at offset ", error.offset,
                                                   "): ", rust_pattern));
  }
  return regex;
}

// ForEachPiece splits valid UTF-8 `text` as a Split pre-tokenizer with
// behaviour "Isolated" does: matches and the gaps between them are pieces;
// the gaps are left out unless `gaps`.
template <typename Visit>
void ForEachPiece(const URegularExpression* regex, absl::string_view text, bool gaps, Visit visit) {
  UErrorCode status = U_ZERO_ERROR;
  Regex matcher(uregex_clone(regex, &status));
  UText* subject = utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &status);
  uregex_setUText(matcher.get(), subject, &status);
  int64_t done = 0;
  while (U_SUCCESS(status) && uregex_findNext(matcher.get(), &status)) {
    const int64_t start = uregex_start64(matcher.get(), 0, &status);
    const int64_t end = uregex_end64(matcher.get(), 0, &status);
    if (gaps && start > done) visit(text.substr(done, start - done));
    if (end > start) visit(text.substr(start, end - start));
    done = end;
  }
  if (gaps && done < static_cast<int64_t>(text.size())) visit(text.substr(done));
  utext_close(subject);
}

uint64_t PairKey(int64_t left, int64_t right) {
  return (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

struct BpeTokenizer::State {
  Model model;
  std::vector<std::string> tokens;      // id -> vocabulary string ("" if unused)
  std::vector<bool> special;            // id -> special added token
  std::array<int64_t, 256> byte_ids{};  // byte -> id of its symbol
  std::array<int64_t, 256> end_ids{};   // byte -> id of its symbol + word-end suffix
  struct Merge {
    int64_t rank;
    int64_t id;
  };
  std::unordered_map<uint64_t, Merge> merges;  // (left id, right id) -> merge
  std::vector<AddedToken> added;
  Regex regex;

  // AppendBpe appends the ids of one pre-tokenized piece.
  void AppendBpe(absl::string_view piece, std::vector<int64_t>& ids) const {
    std::vector<int64_t> word;
    word.reserve(piece.size());
    for (char c : piece) word.push_back(byte_ids[static_cast<unsigned char>(c)]);
    word.back() = end_ids[static_cast<unsigned char>(piece.back())];
    while (word.size() > 1) {
      int64_t best_rank = std::numeric_limits<int64_t>::max();
      const Merge* best = nullptr;
      for (size_t i = 0; i + 1 < word.size(); ++i) {
        auto found = merges.find(PairKey(word[i], word[i + 1]));
        if (found != merges.end() && found->second.rank < best_rank) {
          best_rank = found->second.rank;
          best = &found->second;
        }
      }
      if (best == nullptr) break;
      std::vector<int64_t> merged;
      merged.reserve(word.size());
      for (size_t i = 0; i < word.size(); ++i) {
        if (i + 1 < word.size()) {
          auto found = merges.find(PairKey(word[i], word[i + 1]));
          if (found != merges.end() && found->second.rank == best_rank) {
            merged.push_back(best->id);
            ++i;
            continue;
          }
        }
        merged.push_back(word[i]);
      }
      word.swap(merged);
    }
    ids.insert(ids.end(), word.begin(), word.end());
  }

  // AppendText encodes text holding no added tokens.
  void AppendText(absl::string_view text, std::vector<int64_t>& ids) const {
    while (!text.empty()) {
      const size_t valid = ValidUtf8Prefix(text);
      if (valid > 0) AppendValid(Normalize(text.substr(0, valid)), ids);
      if (valid < text.size()) AppendBpe(text.substr(valid, 1), ids);  // an invalid byte
      text.remove_prefix(std::min(text.size(), valid + 1));
    }
  }

  std::string Normalize(absl::string_view text) const {
    switch (model.normalization) {
      case Normalization::kNfc:
        return Nfc(text);
      case Normalization::kClip:
        return ClipNormalize(text);
      default:
        return std::string(text);
    }
  }

  void AppendValid(const std::string& text, std::vector<int64_t>& ids) const {
    ForEachPiece(regex.get(), text, !model.matches_only, [&](absl::string_view piece) {
      // CLIP's pattern matches its special tokens whole, and its tokenizer
      // gives their ids from its cache (transformers' CLIPTokenizer.bpe).
      const AddedToken* token = model.matches_only ? FindAdded(piece) : nullptr;
      if (token != nullptr) {
        ids.push_back(token->id);
      } else {
        AppendBpe(piece, ids);
      }
    });
  }

  const AddedToken* FindAdded(absl::string_view content) const {
    for (const AddedToken& token : added) {
      if (token.content == content) return &token;
    }
    return nullptr;
  }
};

BpeTokenizer::BpeTokenizer(std::unique_ptr<State> state) : state_(std::move(state)) {}
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

absl::StatusOr<BpeTokenizer> BpeTokenizer::Build(Model model) {
  auto state = std::make_unique<State>();
  int64_t size = 0;
  for (const auto& [token, id] : model.vocab) {
    if (id < 0)
      return absl::InvalidArgumentError(
          absl::StrCat("vocabulary token '", token, "' has negative id ", id));
    size = std::max(size, id + 1);
  }
  for (const AddedToken& added : model.added_tokens) {
    if (added.id < 0)
      return absl::InvalidArgumentError(
          absl::StrCat("added token '", added.content, "' has negative id ", added.id));
    size = std::max(size, added.id + 1);
  }
  state->tokens.assign(size, "");
  state->special.assign(size, false);
  for (const auto& [token, id] : model.vocab) {
    if (!state->tokens[id].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("id ", id, " is used by both '", state->tokens[id], "' and '", token, "'"));
    }
    state->tokens[id] = token;
  }
  for (int b = 0; b < 256; ++b) {
    auto found = model.vocab.find(ByteSymbols()[b]);
    auto end = model.vocab.find(ByteSymbols()[b] + model.end_of_word_suffix);
    if (found == model.vocab.end() || end == model.vocab.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the vocabulary lacks the symbol of byte ", b,
          found == model.vocab.end() ? "" : absl::StrCat(" + '", model.end_of_word_suffix, "'"),
          ": not a byte-level BPE vocabulary"));
    }
    state->byte_ids[b] = found->second;
    state->end_ids[b] = end->second;
  }
  for (size_t rank = 0; rank < model.merges.size(); ++rank) {
    const auto& [left, right] = model.merges[rank];
    auto l = model.vocab.find(left), r = model.vocab.find(right),
         m = model.vocab.find(left + right);
    if (l == model.vocab.end() || r == model.vocab.end() || m == model.vocab.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("merge ", rank, " ('", left, "' '", right,
                       "') uses or makes a token not in the vocabulary"));
    }
    state->merges.emplace(PairKey(l->second, r->second),
                          State::Merge{static_cast<int64_t>(rank), m->second});
  }
  for (const AddedToken& added : model.added_tokens) {
    if (added.content.empty())
      return absl::InvalidArgumentError(absl::StrCat("added token ", added.id, " is empty"));
    auto in_vocab = model.vocab.find(added.content);
    if (in_vocab == model.vocab.end() ? !state->tokens[added.id].empty()
                                      : in_vocab->second != added.id) {
      return absl::InvalidArgumentError(
          absl::StrCat("added token '", added.content, "' has id ", added.id,
                       " which the vocabulary gives to another token"));
    }
    state->tokens[added.id] = added.content;
    state->special[added.id] = added.special;
    state->added.push_back(added);
  }

  DRAY_ASSIGN_OR_RETURN(state->regex, CompilePattern(model.pattern));
  state->model = std::move(model);
  return BpeTokenizer(std::move(state));
}

std::vector<int64_t> BpeTokenizer::Encode(absl::string_view text) const {
  std::vector<int64_t> ids;
  for (const TextOrToken& part : SplitOnAddedTokens(text, state_->added)) {
    if (part.token != nullptr) {
      ids.push_back(part.token->id);
    } else {
      state_->AppendText(part.text, ids);
    }
  }
  return ids;
}

std::vector<int64_t> BpeTokenizer::EncodeText(absl::string_view text) const {
  std::vector<int64_t> ids;
  state_->AppendText(text, ids);
  return ids;
}

std::string BpeTokenizer::Decode(absl::Span<const int64_t> ids, bool skip_special) const {
  std::string text;
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size() || state_->tokens[id].empty()) continue;
    if (state_->special[id]) {
      if (!skip_special) text += state_->tokens[id];
      continue;
    }
    const std::string& token = state_->tokens[id];
    const std::string& suffix = state_->model.end_of_word_suffix;
    const bool word_end = !suffix.empty() && absl::EndsWith(token, suffix);
    text += SymbolBytes(word_end ? token.substr(0, token.size() - suffix.size()) : token);
    if (word_end) text += ' ';
  }
  return text;
}

absl::StatusOr<int64_t> BpeTokenizer::TokenId(absl::string_view token) const {
  const AddedToken* added = state_->FindAdded(token);
  if (added != nullptr) return added->id;
  auto found = state_->model.vocab.find(std::string(token));
  if (found == state_->model.vocab.end()) {
    return absl::NotFoundError(absl::StrCat("the tokenizer has no token '", token, "'"));
  }
  return found->second;
}

int64_t BpeTokenizer::vocab_size() const { return static_cast<int64_t>(state_->tokens.size()); }

const BpeTokenizer::Model& BpeTokenizer::model() const { return state_->model; }

// ---- tokenizer.json ---------------------------------------------------------

namespace {

absl::Status Unsupported(const std::string& name, const std::string& what, const json& value) {
  return absl::UnimplementedError(
      absl::StrCat(name, ": ", what, " ", value.dump(), " is not supported"));
}

// ReadPreTokenizer accepts Sequence[Split(regex, Isolated), ByteLevel(no
// regex)] (Qwen2) or ByteLevel with its regex (GPT-2).
absl::Status ReadPreTokenizer(const json& pre, const std::string& name,
                              BpeTokenizer::Model& model) {
  auto byte_level = [&](const json& p, bool regex) {
    return p.is_object() && p.value("type", "") == "ByteLevel" &&
           !p.value("add_prefix_space", false) && p.value("use_regex", true) == regex;
  };
  if (byte_level(pre, true)) {
    model.pattern = kGpt2Pattern;
    return absl::OkStatus();
  }
  const json* steps =
      pre.is_object() && pre.value("type", "") == "Sequence" ? &pre["pretokenizers"] : nullptr;
  if (steps == nullptr || !steps->is_array() || steps->size() != 2 ||
      !byte_level((*steps)[1], false)) {
    return Unsupported(name, "pre_tokenizer", pre);
  }
  const json& split = (*steps)[0];
  if (split.value("type", "") != "Split" || split.value("behavior", "") != "Isolated" ||
      split.value("invert", false) || !split.contains("pattern") ||
      !split["pattern"].contains("Regex")) {
    return Unsupported(name, "pre_tokenizer step", split);
  }
  model.pattern = split["pattern"]["Regex"].get<std::string>();
  return absl::OkStatus();
}

// ReadMerge reads one merge written as "left right".
absl::StatusOr<std::pair<std::string, std::string>> ReadMerge(const std::string& text,
                                                              const std::string& name) {
  const size_t space = text.find(' ');
  if (space == std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat(name, ": bad merge '", text, "'"));
  return std::make_pair(text.substr(0, space), text.substr(space + 1));
}

absl::Status ReadBpeModel(const json& bpe, const std::string& name, BpeTokenizer::Model& model) {
  if (!bpe.is_object() || bpe.value("type", "BPE") != "BPE" || !bpe["vocab"].is_object() ||
      !bpe["merges"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": \"model\" must be a BPE model with vocab and merges"));
  }
  for (const char* off :
       {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"}) {
    const json& value = bpe.contains(off) ? bpe[off] : json();
    if (!value.is_null() && value != "")
      return Unsupported(name, absl::StrCat("model.", off), value);
  }
  if (bpe.value("byte_fallback", false)) return Unsupported(name, "model.byte_fallback", true);
  for (const auto& [token, id] : bpe["vocab"].items()) model.vocab[token] = id.get<int64_t>();
  for (const json& merge : bpe["merges"]) {
    if (merge.is_array() && merge.size() == 2) {
      model.merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
      continue;
    }
    DRAY_ASSIGN_OR_RETURN(auto pair, ReadMerge(merge.get<std::string>(), name));
    model.merges.push_back(std::move(pair));
  }
  return absl::OkStatus();
}

absl::StatusOr<json> ParseJson(absl::string_view text, const std::string& name) {
  json parsed = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(name, " is not a JSON object"));
  }
  return parsed;
}

// Named prefixes the error of a Build with the name of what it was read from.
absl::StatusOr<BpeTokenizer> Named(absl::StatusOr<BpeTokenizer> tokenizer,
                                   const std::string& name) {
  if (tokenizer.ok()) return tokenizer;
  return absl::Status(tokenizer.status().code(),
                      absl::StrCat(name, ": ", tokenizer.status().message()));
}

}  // namespace

absl::StatusOr<BpeTokenizer> BpeTokenizer::FromJson(absl::string_view text,
                                                    const std::string& name) {
  DRAY_ASSIGN_OR_RETURN(json file, ParseJson(text, name));
  Model model;
  try {
    const json& normalizer = file.contains("normalizer") ? file["normalizer"] : json();
    const bool nfc = normalizer.is_object() && normalizer.value("type", "") == "NFC";
    if (!normalizer.is_null() && !nfc) return Unsupported(name, "normalizer", normalizer);
    model.normalization = nfc ? Normalization::kNfc : Normalization::kNone;
    DRAY_RETURN_IF_ERROR(ReadPreTokenizer(
        file.contains("pre_tokenizer") ? file["pre_tokenizer"] : json(), name, model));
    DRAY_RETURN_IF_ERROR(
        ReadBpeModel(file.contains("model") ? file["model"] : json(), name, model));
    for (const json& token : file.value("added_tokens", json::array())) {
      DRAY_ASSIGN_OR_RETURN(AddedToken added, ReadAddedToken(token, name));
      model.added_tokens.push_back(std::move(added));
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", e.what()));
  }
  return Named(Build(std::move(model)), name);
}

absl::StatusOr<BpeTokenizer> BpeTokenizer::FromDirectory(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "tokenizer.json").string();
  if (std::filesystem::exists(path)) {
    DRAY_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    return FromJson(text, path);
  }
  DRAY_ASSIGN_OR_RETURN(Model model, ReadVocabFiles(dir));
  return Named(Build(std::move(model)), dir);
}

absl::StatusOr<BpeTokenizer::Model> BpeTokenizer::ReadVocabFiles(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path root(dir);
  const std::string vocab_path = (root / "vocab.json").string();
  const std::string merges_path = (root / "merges.txt").string();
  if (!fs::exists(vocab_path) || !fs::exists(merges_path)) {
    return absl::NotFoundError(absl::StrCat(
        dir, " holds no tokenizer: neither tokenizer.json nor vocab.json + merges.txt"));
  }
  Model model;
  DRAY_ASSIGN_OR_RETURN(std::string vocab_text, ReadFile(vocab_path));
  DRAY_ASSIGN_OR_RETURN(json vocab, ParseJson(vocab_text, vocab_path));
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat(vocab_path, ": the id of '", token, "' is not an integer"));
    }
    model.vocab[token] = id.get<int64_t>();
  }
  DRAY_ASSIGN_OR_RETURN(std::string merges_text, ReadFile(merges_path));
  std::istringstream lines(merges_text);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    DRAY_ASSIGN_OR_RETURN(auto merge, ReadMerge(line, merges_path));
    model.merges.push_back(std::move(merge));
  }
  DRAY_ASSIGN_OR_RETURN(json config, ReadTokenizerConfig(dir));
  DRAY_ASSIGN_OR_RETURN(model.added_tokens,
                        ReadAddedTokensDecoder(config, (root / "tokenizer_config.json").string()));
  return model;
}

std::string BpeTokenizer::VocabJson() const {
  json vocab = json::object();
  for (const auto& [token, id] : state_->model.vocab) vocab[token] = id;
  return vocab.dump(2) + "\n";
}

std::string BpeTokenizer::MergesTxt() const {
  std::string text = "#version: 0.2\n";
  for (const auto& [left, right] : state_->model.merges)
    absl::StrAppend(&text, left, " ", right, "\n");
  return text;
}

std::string BpeTokenizer::AddedTokensJson() const {
  json added = json::object();
  for (const AddedToken& token : state_->model.added_tokens) added[token.content] = token.id;
  return added.dump(2) + "\n";
}

std::string BpeTokenizer::ToJson() const {
  const Model& model = state_->model;
  json added = json::array();
  for (const AddedToken& token : model.added_tokens) {
    added.push_back({{"id", token.id},
                     {"content", token.content},
                     {"single_word", false},
                     {"lstrip", token.lstrip},
                     {"rstrip", token.rstrip},
                     {"normalized", false},
                     {"special", token.special}});
  }
  json merges = json::array();
  for (const auto& [left, right] : model.merges) merges.push_back(left + " " + right);
  json byte_level = {{"type", "ByteLevel"},
                     {"add_prefix_space", false},
                     {"trim_offsets", false},
                     {"use_regex", false}};
  json file = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", model.normalization == Normalization::kNfc ? json{{"type", "NFC"}} : json()},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", json::array({{{"type", "Split"},
                                        {"pattern", {{"Regex", model.pattern}}},
                                        {"behavior", "Isolated"},
                                        {"invert", false}},
                                       byte_level})}}},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", json(std::map<std::string, int64_t>(model.vocab.begin(), model.vocab.end()))},
        {"merges", merges}}},
  };
  return file.dump(2);
}

// ---- learning merges --------------------------------------------------------

BpeTokenizer::Model LearnBpeMerges(absl::string_view corpus, int num_merges) {
  BpeTokenizer::Model model;
  for (int b = 0; b < 256; ++b) model.vocab[ByteSymbols()[b]] = b;
  // Words as symbol strings, with their counts, split by the pre-tokenizer.
  std::map<std::vector<std::string>, int64_t> words;
  absl::StatusOr<Regex> regex = CompilePattern(model.pattern);
  ForEachPiece(regex->get(), corpus.substr(0, ValidUtf8Prefix(corpus)), /*gaps=*/true,
               [&](absl::string_view piece) {
                 std::vector<std::string> word;
                 for (char c : piece) word.push_back(ByteSymbols()[static_cast<unsigned char>(c)]);
                 ++words[word];
               });

  for (int merge = 0; merge < num_merges; ++merge) {
    std::map<std::pair<std::string, std::string>, int64_t> pairs;
    for (const auto& [word, count] : words) {
      for (size_t i = 0; i + 1 < word.size(); ++i) pairs[{word[i], word[i + 1]}] += count;
    }
    if (pairs.empty()) break;
    auto best = std::max_element(pairs.begin(), pairs.end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; });
    const auto [left, right] = best->first;
    model.merges.emplace_back(left, right);
    model.vocab.emplace(left + right, static_cast<int64_t>(model.vocab.size()));
    std::map<std::vector<std::string>, int64_t> merged_words;
    for (const auto& [word, count] : words) {
      std::vector<std::string> merged;
      for (size_t i = 0; i < word.size(); ++i) {
        if (i + 1 < word.size() && word[i] == left && word[i + 1] == right) {
          merged.push_back(left + right);
          ++i;
        } else {
          merged.push_back(word[i]);
        }
      }
      merged_words[merged] += count;
    }
    words.swap(merged_words);
  }
  return model;
}

}  // namespace dray
