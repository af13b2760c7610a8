#include "workers/models/model_index.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "workers/models/json_config.h"

namespace dray {
namespace {

struct FamilyPipeline {
  const char* pipeline;
  ModelFamily family;
};

constexpr FamilyPipeline kFamilyPipelines[] = {
    {kQwenImageEditPipeline, ModelFamily::kQwenImage},
    {kQwenImageEditPlusPipeline, ModelFamily::kQwenImage},
    {kFluxKontextPipeline, ModelFamily::kFluxKontext},
};

}  // namespace

std::string ModelIndex::pipeline() const {
  const nlohmann::json name = json.value("_class_name", nlohmann::json());
  return name.is_string() ? name.get<std::string>() : "";
}

absl::Status ModelIndex::CheckComponents(absl::Span<const ModelComponent> components) const {
  for (const ModelComponent& component : components) {
    const nlohmann::json found =
        json.contains(component.folder) ? json[component.folder] : nlohmann::json();
    nlohmann::json expected = nlohmann::json::array();
    for (const auto& [library, class_name] : component.classes)
      expected.push_back({library, class_name});
    if (std::find(expected.begin(), expected.end(), found) != expected.end()) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": component '", component.folder, "' must be ",
        expected.size() == 1 ? expected[0].dump() : absl::StrCat("one of ", expected.dump()),
        ", found ", found.is_null() ? "nothing" : found.dump()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelIndex> ReadModelIndex(const std::string& dir) {
  ModelIndex index;
  index.path = (std::filesystem::path(dir) / "model_index.json").string();
  std::error_code error;
  if (!std::filesystem::exists(index.path, error)) {
    return absl::NotFoundError(
        absl::StrCat(dir, " is not a diffusers model directory: no model_index.json"));
  }
  DRAY_ASSIGN_OR_RETURN(std::string text, ReadFile(index.path));
  index.json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (index.json.is_discarded() || !index.json.is_object())
    return absl::InvalidArgumentError(absl::StrCat(index.path, " is not a JSON object"));
  return index;
}

nlohmann::json NewModelIndex(const std::string& pipeline,
                             absl::Span<const ModelComponent> components) {
  nlohmann::json index = {{"_class_name", pipeline}, {"_diffusers_version", kDiffusersVersion}};
  for (const ModelComponent& component : components)
    index[component.folder] = {component.classes[0].first, component.classes[0].second};
  return index;
}

absl::Status WriteModelIndex(const std::string& dir, const nlohmann::json& index,
                             absl::Span<const ModelComponent> components) {
  for (const ModelComponent& component : components) {
    const std::filesystem::path folder = std::filesystem::path(dir) / component.folder;
    std::error_code error;
    std::filesystem::create_directories(folder, error);
    if (error) {
      return absl::UnavailableError(
          absl::StrCat("cannot create ", folder.string(), ": ", error.message()));
    }
  }
  return WriteFile((std::filesystem::path(dir) / "model_index.json").string(),
                   absl::StrCat(index.dump(2), "\n"));
}

absl::StatusOr<ModelFamily> ReadModelFamily(const std::string& dir) {
  DRAY_ASSIGN_OR_RETURN(ModelIndex index, ReadModelIndex(dir));
  const std::string pipeline = index.pipeline();
  std::string known;
  for (const FamilyPipeline& entry : kFamilyPipelines) {
    if (pipeline == entry.pipeline) return entry.family;
    absl::StrAppend(&known, known.empty() ? "" : ", ", entry.pipeline);
  }
  return absl::InvalidArgumentError(absl::StrCat(index.path,
                                                 ": _class_name must name a pipeline dray runs (",
                                                 known, "), found \"", pipeline, "\""));
}

}  // namespace dray
