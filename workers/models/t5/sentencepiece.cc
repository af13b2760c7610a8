#include "workers/models/t5/sentencepiece.h"

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <unordered_map>
#include <utility>

#include <unicode/utf8.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/files.h"
#include "base/status_macros.h"

namespace dray::t5 {
namespace {

// ---- protobuf's wire format -------------------------------------------------

enum WireType { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// WireField: one field of a protobuf message.
struct WireField {
  uint32_t number = 0;
  int type = kVarint;
  uint64_t value = 0;       // of varint and fixed-size fields
  absl::string_view bytes;  // of length-delimited fields
};

// ReadVarint takes a base-128 varint off the front of `data`.
bool ReadVarint(absl::string_view& data, uint64_t& value) {
  value = 0;
  for (int shift = 0; shift < 64 && !data.empty(); shift += 7) {
    const uint8_t byte = static_cast<uint8_t>(data.front());
    data.remove_prefix(1);
    value |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

uint64_t LittleEndian(absl::string_view bytes) {
  uint64_t value = 0;
  for (size_t i = bytes.size(); i > 0; --i) value = value << 8 | static_cast<uint8_t>(bytes[i - 1]);
  return value;
}

// ReadField takes one field off the front of `data`.
bool ReadField(absl::string_view& data, WireField& field) {
  uint64_t key = 0;
  if (!ReadVarint(data, key)) return false;
  field.number = static_cast<uint32_t>(key >> 3);
  field.type = static_cast<int>(key & 7);
  uint64_t size = 0;
  switch (field.type) {
    case kVarint:
      return ReadVarint(data, field.value);
    case kFixed64:
    case kFixed32:
      size = field.type == kFixed64 ? 8 : 4;
      if (data.size() < size) return false;
      field.value = LittleEndian(data.substr(0, size));
      break;
    case kLengthDelimited:
      if (!ReadVarint(data, size) || size > data.size()) return false;
      field.bytes = data.substr(0, size);
      break;
    default:  // groups
      return false;
  }
  data.remove_prefix(size);
  return true;
}

// ReadMessage calls `visit` (returning false for a field it cannot take)
// with each field of the message `data`; false for malformed data.
template <typename Visit>
bool ReadMessage(absl::string_view data, Visit visit) {
  WireField field;
  while (!data.empty()) {
    if (!ReadField(data, field) || !visit(field)) return false;
  }
  return true;
}

// ---- sentencepiece_model.proto ----------------------------------------------

enum PieceType {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

struct ModelPiece {
  std::string text;
  float score = 0;
  int type = kNormal;
};

struct NormalizerSpec {
  std::string precompiled_charsmap;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
};

// ModelProto: the fields of sentencepiece.ModelProto that encoding reads.
struct ModelProto {
  std::vector<ModelPiece> pieces;
  // trainer_spec
  int model_type = 1;  // UNIGRAM
  bool treat_whitespace_as_suffix = false;
  bool byte_fallback = false;
  NormalizerSpec normalizer;
};

bool ReadPiece(absl::string_view bytes, ModelPiece& piece) {
  return ReadMessage(bytes, [&](const WireField& field) {
    if (field.number == 1 && field.type == kLengthDelimited) {
      piece.text = std::string(field.bytes);
    } else if (field.number == 2 && field.type == kFixed32) {
      const uint32_t bits = static_cast<uint32_t>(field.value);
      std::memcpy(&piece.score, &bits, sizeof(bits));
    } else if (field.number == 3 && field.type == kVarint) {
      piece.type = static_cast<int>(field.value);
    } else {
      return field.number > 3;
    }
    return true;
  });
}

// The fields read below hold varints unless said otherwise: a field of
// another wire type makes the file malformed (false), not silently read.
bool ReadTrainerSpec(absl::string_view bytes, ModelProto& model) {
  return ReadMessage(bytes, [&](const WireField& field) {
    const bool read = field.number == 3 || field.number == 24 || field.number == 35;
    if (!read) return true;
    if (field.type != kVarint) return false;
    if (field.number == 3) model.model_type = static_cast<int>(field.value);
    if (field.number == 24) model.treat_whitespace_as_suffix = field.value != 0;
    if (field.number == 35) model.byte_fallback = field.value != 0;
    return true;
  });
}

bool ReadNormalizerSpec(absl::string_view bytes, NormalizerSpec& spec) {
  return ReadMessage(bytes, [&](const WireField& field) {
    if (field.number < 2 || field.number > 5) return true;
    if (field.type != (field.number == 2 ? kLengthDelimited : kVarint)) return false;
    if (field.number == 2) spec.precompiled_charsmap = std::string(field.bytes);
    if (field.number == 3) spec.add_dummy_prefix = field.value != 0;
    if (field.number == 4) spec.remove_extra_whitespaces = field.value != 0;
    if (field.number == 5) spec.escape_whitespaces = field.value != 0;
    return true;
  });
}

bool ReadModelProto(absl::string_view bytes, ModelProto& model) {
  return ReadMessage(bytes, [&](const WireField& field) {
    if (field.number >= 1 && field.number <= 3 && field.type != kLengthDelimited) return false;
    switch (field.number) {
      case 1:
        model.pieces.emplace_back();
        return ReadPiece(field.bytes, model.pieces.back());
      case 2:
        return ReadTrainerSpec(field.bytes, model);
      case 3:
        return ReadNormalizerSpec(field.bytes, model.normalizer);
      default:
        return true;
    }
  });
}

// ---- the precompiled character map ------------------------------------------

// CharsMap: source strings in a Darts-clone double-array trie whose values
// are offsets of NUL-terminated replacements.
class CharsMap {
 public:
  // Read splits a blob: <trie size (4 bytes)><trie units><replacements>.
  bool Read(absl::string_view blob) {
    if (blob.size() <= 4) return false;
    const uint64_t trie_size = LittleEndian(blob.substr(0, 4));
    blob.remove_prefix(4);
    if (trie_size > blob.size()) return false;
    for (size_t i = 0; i + 4 <= trie_size; i += 4)
      units_.push_back(LittleEndian(blob.substr(i, 4)));
    replacements_ = std::string(blob.substr(trie_size));
    return true;
  }

  // LongestMatch returns the length of the longest source string that
  // `text` starts with (0 for none) and sets `replacement` to its
  // replacement (Darts' commonPrefixSearch).
  size_t LongestMatch(absl::string_view text, absl::string_view& replacement) const {
    if (units_.empty()) return 0;
    size_t longest = 0;
    size_t node = Offset(units_[0]);
    for (size_t i = 0; i < text.size(); ++i) {
      const uint8_t byte = static_cast<uint8_t>(text[i]);
      node ^= byte;
      if (node >= units_.size() || Label(units_[node]) != byte) break;
      const bool leaf = ((units_[node] >> 8) & 1) == 1;
      node ^= Offset(units_[node]);
      if (!leaf || node >= units_.size()) continue;
      const uint32_t value = units_[node] & ((1U << 31) - 1);
      if (value < replacements_.size()) {
        longest = i + 1;
        replacement = replacements_.c_str() + value;
      }
    }
    return longest;
  }

 private:
  static uint32_t Label(uint32_t unit) { return unit & ((1U << 31) | 0xFF); }
  static size_t Offset(uint32_t unit) { return (unit >> 10) << ((unit & (1U << 9)) >> 6); }

  std::vector<uint32_t> units_;
  std::string replacements_;
};

// Utf8CharSize: the size of the UTF-8 character `text` starts with, 0 if
// it does not start with one.
size_t Utf8CharSize(absl::string_view text) {
  int32_t size = 0;
  UChar32 c;
  U8_NEXT(text.data(), size, static_cast<int32_t>(text.size()), c);
  return c < 0 ? 0 : size;
}

// LeadByteSize: the character size that a UTF-8 lead byte announces
// (libsentencepiece's OneCharLen).
size_t LeadByteSize(char byte) {
  const uint8_t high = static_cast<uint8_t>(byte) >> 4;
  return high < 12 ? 1 : high < 14 ? 2 : high == 14 ? 3 : 4;
}

constexpr char kSpaceSymbol[] = "\xE2\x96\x81";  // U+2581, "▁"
constexpr float kUnknownPenalty = 10.0;

}  // namespace

struct SentencePiece::State {
  std::vector<ModelPiece> pieces;
  std::unordered_map<std::string, int64_t> segments;  // normal and unused pieces, by text
  std::unordered_map<std::string, int64_t> reserved;  // control and unknown pieces
  int64_t unk_id = -1;
  float min_score = FLT_MAX;  // of normal pieces
  size_t max_piece_size = 0;  // bytes
  CharsMap charsmap;
  NormalizerSpec spec;

  // NormalizePrefix returns the replacement of the longest source string
  // `input` starts with, or of its first character (U+FFFD for a byte
  // that is not UTF-8), and how many bytes it replaces.
  std::pair<absl::string_view, size_t> NormalizePrefix(absl::string_view input) const {
    absl::string_view replacement;
    const size_t matched = charsmap.LongestMatch(input, replacement);
    if (matched > 0) return {replacement, matched};
    const size_t size = Utf8CharSize(input);
    if (size == 0) return {"\xEF\xBF\xBD", 1};
    return {input.substr(0, size), size};
  }

  // Normalize is libsentencepiece's Normalizer::Normalize.
  std::string Normalize(absl::string_view input) const {
    if (spec.remove_extra_whitespaces) {
      while (!input.empty()) {
        const auto [replacement, size] = NormalizePrefix(input);
        if (replacement != " ") break;
        input.remove_prefix(size);
      }
    }
    if (input.empty()) return "";
    const absl::string_view space = spec.escape_whitespaces ? kSpaceSymbol : " ";
    std::string out = spec.add_dummy_prefix ? std::string(space) : "";
    bool after_space = spec.remove_extra_whitespaces;
    while (!input.empty()) {
      auto [replacement, size] = NormalizePrefix(input);
      while (after_space && absl::ConsumePrefix(&replacement, " ")) {
      }
      for (char c : replacement) {
        if (c == ' ') {
          out.append(space.data(), space.size());
        } else {
          out += c;
        }
      }
      if (!replacement.empty()) after_space = absl::EndsWith(replacement, " ");
      if (!spec.remove_extra_whitespaces) after_space = false;
      input.remove_prefix(size);
    }
    while (spec.remove_extra_whitespaces && absl::EndsWith(out, space)) {
      out.resize(out.size() - space.size());
    }
    return out;
  }

  struct Node {
    int64_t id = -1;
    float score = 0;  // of the best segmentation ending here
    int64_t start = -1;
  };

  static void Update(Node& node, int64_t id, double score, size_t start) {
    if (node.start == -1 || score > node.score) {
      node = {id, static_cast<float>(score), static_cast<int64_t>(start)};
    }
  }

  // Viterbi is libsentencepiece's unigram Model::EncodeOptimized: the
  // pieces (and ids) of the best segmentation of `text`.
  std::vector<std::pair<absl::string_view, int64_t>> Viterbi(absl::string_view text) const {
    std::vector<Node> best(text.size() + 1);
    const float unknown_score = min_score - kUnknownPenalty;
    for (size_t start = 0; start < text.size();) {
      const float here = best[start].score;
      const size_t char_size = std::min(LeadByteSize(text[start]), text.size() - start);
      bool covered = false;  // by a piece of one character
      for (size_t end = start + 1; end <= std::min(text.size(), start + max_piece_size); ++end) {
        auto found = segments.find(std::string(text.substr(start, end - start)));
        if (found == segments.end() || pieces[found->second].type == kUnused) continue;
        // As there: a piece's score plus the float best in double, kept as float.
        Update(best[end], found->second, static_cast<double>(pieces[found->second].score) + here,
               start);
        covered = covered || end - start == char_size;
      }
      if (!covered) Update(best[start + char_size], unk_id, unknown_score + here, start);
      start += char_size;
    }
    std::vector<std::pair<absl::string_view, int64_t>> path;
    for (size_t end = text.size(); end > 0; end = best[end].start) {
      path.emplace_back(text.substr(best[end].start, end - best[end].start), best[end].id);
    }
    std::reverse(path.begin(), path.end());
    return path;
  }

  // AddPieces indexes the pieces as libsentencepiece's InitializePieces does.
  absl::Status AddPieces(std::vector<ModelPiece> all, const std::string& name) {
    pieces = std::move(all);
    for (size_t id = 0; id < pieces.size(); ++id) {
      const ModelPiece& piece = pieces[id];
      if (piece.type == kUserDefined || piece.type == kByte) {
        return absl::UnimplementedError(absl::StrCat(name, ": piece ", id, " '", piece.text,
                                                     "' is user-defined or a byte piece"));
      }
      const bool segment = piece.type == kNormal || piece.type == kUnused;
      if (piece.text.empty() || !(segment ? segments : reserved).emplace(piece.text, id).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": piece ", id, " '", piece.text, "' is empty or already defined"));
      }
      if (piece.type == kUnknown && unk_id >= 0) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": two unknown pieces"));
      }
      if (piece.type == kUnknown) unk_id = static_cast<int64_t>(id);
      if (piece.type == kNormal) min_score = std::min(min_score, piece.score);
      if (segment) max_piece_size = std::max(max_piece_size, piece.text.size());
    }
    if (unk_id < 0 || segments.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": no unknown piece or no normal pieces"));
    }
    return absl::OkStatus();
  }
};

SentencePiece::SentencePiece(std::unique_ptr<State> state) : state_(std::move(state)) {}
SentencePiece::SentencePiece(SentencePiece&&) noexcept = default;
SentencePiece& SentencePiece::operator=(SentencePiece&&) noexcept = default;
SentencePiece::~SentencePiece() = default;

absl::StatusOr<SentencePiece> SentencePiece::FromFile(const std::string& path) {
  DRAY_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  return FromSerialized(bytes, path);
}

absl::StatusOr<SentencePiece> SentencePiece::FromSerialized(absl::string_view bytes,
                                                            const std::string& name) {
  ModelProto model;
  if (!ReadModelProto(bytes, model)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " is not a SentencePiece model (a serialized ModelProto)"));
  }
  if (model.model_type != 1 || model.byte_fallback || model.treat_whitespace_as_suffix) {
    return absl::UnimplementedError(absl::StrCat(
        name,
        ": only unigram models without byte_fallback or treat_whitespace_as_suffix are "
        "supported (model_type ",
        model.model_type, ")"));
  }
  auto state = std::make_unique<State>();
  state->spec = std::move(model.normalizer);
  if (!state->spec.precompiled_charsmap.empty() &&
      !state->charsmap.Read(state->spec.precompiled_charsmap)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": the precompiled_charsmap is broken"));
  }
  DRAY_RETURN_IF_ERROR(state->AddPieces(std::move(model.pieces), name));
  return SentencePiece(std::move(state));
}

std::vector<SentencePiece::Piece> SentencePiece::Encode(absl::string_view text) const {
  const std::string normalized = state_->Normalize(text);
  std::vector<Piece> pieces;
  for (const auto& [piece, id] : state_->Viterbi(normalized)) {
    if (id == state_->unk_id && !pieces.empty() && pieces.back().id == state_->unk_id) {
      pieces.back().text.append(piece.data(), piece.size());  // a run of unknown pieces
    } else {
      pieces.push_back({std::string(piece), id});
    }
  }
  return pieces;
}

std::optional<int64_t> SentencePiece::FindPiece(absl::string_view piece) const {
  for (const auto* map : {&state_->reserved, &state_->segments}) {
    auto found = map->find(std::string(piece));
    if (found != map->end()) return found->second;
  }
  return std::nullopt;
}

int64_t SentencePiece::PieceToId(absl::string_view piece) const {
  return FindPiece(piece).value_or(state_->unk_id);
}

int64_t SentencePiece::unk_id() const { return state_->unk_id; }

int64_t SentencePiece::size() const { return static_cast<int64_t>(state_->pieces.size()); }

}  // namespace dray::t5
