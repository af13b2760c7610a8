#include "workers/models/clip/tokenizer.h"

#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "workers/models/added_tokens.h"

namespace dray::clip {
namespace {

// kPattern: CLIPTokenizer's regular expression, whose matches are the
// pieces, as Python's `regex` runs it there (re.IGNORECASE) on lowercased
// text: ignoring case matters to the literals alone ("'ſ" is "'s"), and
// U+0345 (a combining mark that case-folds to a letter) matches nothing.
constexpr char kPattern[] =
    R"((?i:<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d)|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}\x{345}]+)";

// kMaxMerges: how many lines of merges.txt CLIPTokenizer reads past its
// header (49152 - 256 - 2).
constexpr size_t kMaxMerges = 48894;

}  // namespace

absl::StatusOr<Tokenizer> Tokenizer::FromDirectory(const std::string& dir) {
  DRAY_ASSIGN_OR_RETURN(BpeTokenizer::Model model, BpeTokenizer::ReadVocabFiles(dir));
  model.pattern = kPattern;
  model.matches_only = true;
  model.normalization = BpeTokenizer::Normalization::kClip;
  model.end_of_word_suffix = "</w>";
  if (model.merges.size() > kMaxMerges) model.merges.resize(kMaxMerges);
  absl::StatusOr<BpeTokenizer> bpe = BpeTokenizer::Build(std::move(model));
  if (!bpe.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": ", bpe.status().message()));
  }
  Tokenizer tokenizer(std::move(*bpe));
  DRAY_ASSIGN_OR_RETURN(nlohmann::json config, ReadTokenizerConfig(dir));
  const std::string name = absl::StrCat(dir, "/tokenizer_config.json");
  auto special_id = [&](const char* key, const char* fallback) -> absl::StatusOr<int64_t> {
    DRAY_ASSIGN_OR_RETURN(std::string text, SpecialToken(config, key, fallback, name));
    absl::StatusOr<int64_t> id = tokenizer.bpe_.TokenId(text);
    if (!id.ok())
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", id.status().message()));
    return id;
  };
  DRAY_ASSIGN_OR_RETURN(tokenizer.bos_id_, special_id("bos_token", "<|startoftext|>"));
  DRAY_ASSIGN_OR_RETURN(tokenizer.eos_id_, special_id("eos_token", "<|endoftext|>"));
  DRAY_ASSIGN_OR_RETURN(tokenizer.pad_id_, special_id("pad_token", "<|endoftext|>"));
  return tokenizer;
}

absl::StatusOr<std::vector<int64_t>> Tokenizer::Encode(absl::string_view text,
                                                       int64_t max_length) const {
  if (max_length < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("CLIP max_length must be at least 2 (room for the start and end tokens), got ",
                     max_length));
  }
  std::vector<int64_t> ids = Ids(text, static_cast<size_t>(max_length - 2));
  ids.resize(static_cast<size_t>(max_length), pad_id_);
  return ids;
}

std::vector<int64_t> Tokenizer::EncodeUnpadded(absl::string_view text) const {
  return Ids(text, std::numeric_limits<size_t>::max());
}

// Ids: <|startoftext|>, the first `max_size` tokens of `text`, <|endoftext|>.
std::vector<int64_t> Tokenizer::Ids(absl::string_view text, size_t max_size) const {
  std::vector<int64_t> ids = bpe_.Encode(text);
  if (ids.size() > max_size) ids.resize(max_size);
  ids.insert(ids.begin(), bos_id_);
  ids.push_back(eos_id_);
  return ids;
}

}  // namespace dray::clip
