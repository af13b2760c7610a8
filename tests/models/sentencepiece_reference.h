// ReferenceSentencePiece: Debian's libsentencepiece, the reference that
// tests/models/sentencepiece_parity_test.cc holds dray's own SentencePiece
// (workers/models/t5/sentencepiece.h) to. Test processes only, and only
// those without gRPC: the library's bundled protobuf takes the place of
// gRPC's. Standard types only: sentencepiece_processor.h declares
// absl::string_view as std::string_view, which clashes with Debian's
// Abseil, so it is included by sentencepiece_reference.cc alone.
//
//   ReferenceSentencePiece reference("tokenizer_2/spiece.model");
//   ASSERT_TRUE(reference.ok());
//   for (const auto& [piece, id] : reference.Encode("Make the sky blue")) ...
//
// Thread-safety: Encode may run on many threads at once.
#ifndef DRAY_TESTS_MODELS_SENTENCEPIECE_REFERENCE_H_
#define DRAY_TESTS_MODELS_SENTENCEPIECE_REFERENCE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}  // namespace sentencepiece

namespace dray {

class ReferenceSentencePiece {
 public:
  // ReferenceSentencePiece loads the model at `path`; ok() says whether it could.
  explicit ReferenceSentencePiece(const std::string& path);
  ~ReferenceSentencePiece();

  bool ok() const;
  // Encode returns the pieces of `text` with their ids
  // (SentencePieceProcessor::Encode).
  std::vector<std::pair<std::string, int>> Encode(const std::string& text) const;

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  bool ok_ = false;
};

}  // namespace dray

#endif  // DRAY_TESTS_MODELS_SENTENCEPIECE_REFERENCE_H_
