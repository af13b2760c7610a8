// Reading and writing a diffusers model directory's model_index.json: which pipeline
// the directory is made for (its _class_name, hence dray's model family)
// and whether each component folder holds the class that pipeline expects;
// writing one's skeleton (dray init-model).
//
//   DRAY_ASSIGN_OR_RETURN(ModelFamily family, ReadModelFamily("ckpt/"));
//   if (family == ModelFamily::kFluxKontext) ...
#ifndef DRAY_WORKERS_MODELS_MODEL_INDEX_H_
#define DRAY_WORKERS_MODELS_MODEL_INDEX_H_

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dray {

// The pipelines dray runs, as model_index.json's _class_name names them.
inline constexpr char kQwenImageEditPipeline[] = "QwenImageEditPipeline";
inline constexpr char kQwenImageEditPlusPipeline[] = "QwenImageEditPlusPipeline";
inline constexpr char kFluxKontextPipeline[] = "FluxKontextPipeline";

// ModelComponent: a component folder and the (library, class) pairs it may
// hold, e.g. {"tokenizer_2", {{"transformers", "T5Tokenizer"},
// {"transformers", "T5TokenizerFast"}}}.
struct ModelComponent {
  const char* folder;
  std::vector<std::pair<const char*, const char*>> classes;
};

// ModelIndex: a parsed model_index.json.
struct ModelIndex {
  std::string path;  // of model_index.json, for errors
  nlohmann::json json;
  // pipeline: the _class_name ("" when absent).
  std::string pipeline() const;
  // CheckComponents: INVALID_ARGUMENT naming the first component that is
  // missing or of another class.
  absl::Status CheckComponents(absl::Span<const ModelComponent> components) const;
};

// ReadModelIndex: `dir`/model_index.json; NOT_FOUND when there is none (not
// a diffusers model directory), INVALID_ARGUMENT when it is not a JSON object.
absl::StatusOr<ModelIndex> ReadModelIndex(const std::string& dir);

// NewModelIndex: the model_index.json of a `pipeline` directory with
// `components` (each its first class), as diffusers writes it.
nlohmann::json NewModelIndex(const std::string& pipeline,
                             absl::Span<const ModelComponent> components);

// WriteModelIndex makes `dir` a model directory: a folder for each of
// `components` and `index` as its model_index.json.
absl::Status WriteModelIndex(const std::string& dir, const nlohmann::json& index,
                             absl::Span<const ModelComponent> components);

// ModelFamily: the model families dray runs, by pipeline class.
enum class ModelFamily {
  kQwenImage,    // QwenImageEditPipeline, QwenImageEditPlusPipeline
  kFluxKontext,  // FluxKontextPipeline
};

// ReadModelFamily: the family of the pipeline `dir` names; INVALID_ARGUMENT
// naming the pipelines dray knows when it names another.
absl::StatusOr<ModelFamily> ReadModelFamily(const std::string& dir);

}  // namespace dray

#endif  // DRAY_WORKERS_MODELS_MODEL_INDEX_H_
