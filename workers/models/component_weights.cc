#include "workers/models/component_weights.h"

#include <filesystem>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/files.h"

namespace dray {

namespace fs = std::filesystem;

absl::StatusOr<Checkpoint> OpenComponentWeights(const std::string& dir) {
  std::vector<std::string> indexes;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    if (absl::EndsWith(entry.path().string(), ".safetensors.index.json"))
      indexes.push_back(entry.path().string());
  }
  if (indexes.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, " holds ", indexes.size(), " *.safetensors.index.json files; expected one"));
  }
  if (indexes.size() == 1) return Checkpoint::Open(indexes[0]);
  for (const char* name : {"diffusion_pytorch_model.safetensors", "model.safetensors"}) {
    const fs::path file = fs::path(dir) / name;
    if (fs::exists(file, error)) return Checkpoint::Open(file.string());
  }
  return absl::NotFoundError(
      absl::StrCat(dir,
                   " holds no *.safetensors.index.json, diffusion_pytorch_model.safetensors or "
                   "model.safetensors"));
}

absl::Status WriteComponentConfig(const std::string& path, const std::string& json) {
  return WriteFile(path, absl::StrCat(json, "\n"));
}

absl::Status WriteComponentWeights(const std::string& path, torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& parameter : module.named_parameters())
    tensors.emplace_back(parameter.key(), parameter.value());
  return WriteSafetensors(path, tensors, {{"format", "pt"}});
}

}  // namespace dray
