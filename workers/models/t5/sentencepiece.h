// SentencePiece: a SentencePiece unigram model (T5's `spiece.model`) that
// encodes exactly as libsentencepiece 0.1.97 (Debian 12's) does, read and
// run by dray itself. dray cannot link that library: it carries a protobuf
// 3.14 of its own whose exported google::protobuf symbols take the place of
// those of gRPC's protobuf 3.21 in a process that loads both, and such a
// process crashes before main (tests/models/sentencepiece_parity_test.cc
// compares the two in a process without gRPC).
//
// Encoding (SentencePieceProcessor::Encode):
//   1. normalization by the model's precompiled character map (T5's
//      "nmt_nfkc": NFKC plus SentencePiece's rules); leading, trailing and
//      repeated spaces removed, a space put in front (add_dummy_prefix),
//      spaces written "▁"; bytes that are not UTF-8 become U+FFFD;
//   2. the segmentation of highest total piece score (Viterbi); a
//      character that no piece covers is unknown, scored below every piece;
//   3. runs of unknown pieces merged into one piece with the unknown id.
//
//   DRAY_ASSIGN_OR_RETURN(t5::SentencePiece model,
//                         t5::SentencePiece::FromFile("tokenizer_2/spiece.model"));
//   for (const t5::SentencePiece::Piece& piece : model.Encode("Make the sky blue")) {
//     ... piece.text ("▁Make") ... piece.id ...
//   }
//
// Unigram models only, without user-defined symbols, byte fallback or
// treat_whitespace_as_suffix (T5's and FLUX.1's have none); others are
// UNIMPLEMENTED.
//
// Thread-safety: immutable after loading; Encode may run on many threads at
// once.
#ifndef DRAY_WORKERS_MODELS_T5_SENTENCEPIECE_H_
#define DRAY_WORKERS_MODELS_T5_SENTENCEPIECE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dray::t5 {

class SentencePiece {
 public:
  // Piece: one piece of an encoded text, as normalized ("▁the").
  struct Piece {
    std::string text;
    int64_t id = 0;
  };

  // FromFile reads a serialized ModelProto (`spiece.model`): NOT_FOUND
  // without the file, INVALID_ARGUMENT for a malformed one.
  static absl::StatusOr<SentencePiece> FromFile(const std::string& path);
  // FromSerialized reads the bytes of a ModelProto; `name` prefixes errors.
  static absl::StatusOr<SentencePiece> FromSerialized(absl::string_view bytes,
                                                      const std::string& name);

  SentencePiece(SentencePiece&&) noexcept;
  SentencePiece& operator=(SentencePiece&&) noexcept;
  ~SentencePiece();

  // Encode normalizes and segments `text` (any bytes).
  std::vector<Piece> Encode(absl::string_view text) const;
  // FindPiece returns the id of `piece`, if the model has it.
  std::optional<int64_t> FindPiece(absl::string_view piece) const;
  // PieceToId returns the id of `piece`, or unk_id() (libsentencepiece's PieceToId).
  int64_t PieceToId(absl::string_view piece) const;
  int64_t unk_id() const;
  // size: the number of pieces (ids are 0..size-1).
  int64_t size() const;

 private:
  struct State;
  explicit SentencePiece(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace dray::t5

#endif  // DRAY_WORKERS_MODELS_T5_SENTENCEPIECE_H_
