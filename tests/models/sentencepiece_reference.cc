#include "tests/models/sentencepiece_reference.h"

#include <sentencepiece_processor.h>

namespace dray {

ReferenceSentencePiece::ReferenceSentencePiece(const std::string& path)
    : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()),
      ok_(processor_->Load(path).ok()) {}

ReferenceSentencePiece::~ReferenceSentencePiece() = default;

bool ReferenceSentencePiece::ok() const { return ok_; }

std::vector<std::pair<std::string, int>> ReferenceSentencePiece::Encode(
    const std::string& text) const {
  std::vector<std::string> texts;
  std::vector<int> ids;
  std::vector<std::pair<std::string, int>> pieces;
  if (!processor_->Encode(text, &texts).ok() || !processor_->Encode(text, &ids).ok()) return pieces;
  for (size_t i = 0; i < texts.size() && i < ids.size(); ++i) pieces.emplace_back(texts[i], ids[i]);
  return pieces;
}

}  // namespace dray
