#include "workers/models/qwen_image/embedded_model.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "runtime/io/safetensors.h"
#include "workers/models/component_weights.h"
#include "workers/models/qwen_image/model.h"

// The packed weights, linked in by //workers/models/qwen_image:embedded_weights.
extern "C" {
extern const char dray_embedded_model_start[];
extern const char dray_embedded_model_end[];
}

namespace dray::qwen_image {
namespace {

namespace fs = std::filesystem;

// TrainedComponent: a component whose weights dray trained, and how they are packed.
struct TrainedComponent {
  const char* folder;
  const char* file;  // as LoadQwenImageModel looks for it
  at::ScalarType packed_dtype;
};

constexpr TrainedComponent kTrainedComponents[] = {
    {"transformer", "diffusion_pytorch_model.safetensors", at::kHalf},
    {"vae", "diffusion_pytorch_model.safetensors", at::kHalf},
    {"text_encoder", "model.safetensors", at::kFloat},
};

}  // namespace

absl::Status WriteModelWithPackedWeights(const std::string& dir, const std::string& packed_path) {
  DRAY_ASSIGN_OR_RETURN(std::shared_ptr<const SafetensorsFile> packed,
                        SafetensorsFile::Open(packed_path));
  DRAY_ASSIGN_OR_RETURN(ModelPreset embedded, PresetNamed("embedded"));
  DRAY_RETURN_IF_ERROR(WriteQwenImageModelConfigs(dir, embedded).status());
  for (const TrainedComponent& component : kTrainedComponents) {
    const std::string prefix = absl::StrCat(component.folder, "/");
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const std::string& name : packed->names()) {
      if (!absl::StartsWith(name, prefix)) continue;
      DRAY_ASSIGN_OR_RETURN(at::Tensor tensor, packed->Get(name));
      tensors.emplace_back(name.substr(prefix.size()), tensor.to(at::kFloat));
    }
    if (tensors.empty()) {
      return absl::DataLossError(
          absl::StrCat(packed_path, " holds no weights named ", prefix, "..."));
    }
    DRAY_RETURN_IF_ERROR(WriteSafetensors(
        (fs::path(dir) / component.folder / component.file).string(), tensors, {{"format", "pt"}}));
  }
  return absl::OkStatus();
}

absl::Status WriteEmbeddedModel(const std::string& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  const std::string packed = (fs::path(dir) / "embedded_weights.safetensors").string();
  DRAY_RETURN_IF_ERROR(
      WriteFile(packed, absl::string_view(dray_embedded_model_start,
                                          dray_embedded_model_end - dray_embedded_model_start)));
  const absl::Status written = WriteModelWithPackedWeights(dir, packed);
  fs::remove(packed, error);
  return written;
}

absl::Status PackModelWeights(const std::string& model_dir, const std::string& packed_path) {
  std::vector<std::pair<std::string, at::Tensor>> packed;
  for (const TrainedComponent& component : kTrainedComponents) {
    DRAY_ASSIGN_OR_RETURN(Checkpoint weights,
                          OpenComponentWeights((fs::path(model_dir) / component.folder).string()));
    for (const std::string& name : weights.names()) {
      DRAY_ASSIGN_OR_RETURN(at::Tensor tensor, weights.Get(name));
      packed.emplace_back(absl::StrCat(component.folder, "/", name),
                          tensor.to(component.packed_dtype));
    }
  }
  return WriteSafetensors(packed_path, packed, {{"format", "pt"}});
}

}  // namespace dray::qwen_image
