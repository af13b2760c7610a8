#include "workers/parity/parity_case.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/shape_string.h"
#include "base/status_macros.h"

namespace dray {

ParityResult CompareTensors(const ParityCase& c, std::string output, const at::Tensor& actual,
                            const at::Tensor& expected, double atol, double rtol) {
  ParityResult result{c.component, c.name, std::move(output)};
  result.atol = atol;
  result.rtol = rtol;
  if (actual.sizes() != expected.sizes()) {
    result.error = absl::StrCat("shape ", ShapeString(actual.sizes()), ", reference ",
                                ShapeString(expected.sizes()));
    return result;
  }
  const at::Tensor a = actual.detach().to(at::kCPU, at::kDouble);
  const at::Tensor b = expected.to(at::kCPU, at::kDouble);
  const at::Tensor both_nan = at::isnan(a) & at::isnan(b);
  const at::Tensor diff = at::where(both_nan, at::zeros_like(a), (a - b).abs());
  if (diff.numel() > 0) {
    result.max_abs = at::nan_to_num(diff, /*nan=*/INFINITY).max().item<double>();
    const at::Tensor scale = b.abs();
    const at::Tensor significant = scale > atol;
    if (significant.any().item<bool>())
      result.max_rel = (diff / scale).masked_select(significant).max().item<double>();
  }
  result.passed = (both_nan | (diff <= atol + rtol * b.abs())).all().item<bool>();
  return result;
}

std::vector<ParityCase> CaseFilesIn(const std::string& component, const std::string& folder,
                                    const ParityRun& run) {
  std::vector<ParityCase> cases;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(folder, error)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind("case_", 0) == 0 && entry.path().extension() == ".safetensors")
      cases.push_back({component, folder, entry.path().stem().string(), run});
  }
  std::sort(cases.begin(), cases.end(),
            [](const ParityCase& a, const ParityCase& b) { return a.name < b.name; });
  return cases;
}

std::vector<ParityResult> RunParityCase(const ParityCase& c) {
  absl::StatusOr<std::vector<ParityResult>> results;
  try {
    results = c.run(c);
  } catch (const std::exception& e) {  // malformed case files (JSON fields, tensor shapes)
    results = absl::InvalidArgumentError(absl::StrCat("malformed case: ", e.what()));
  }
  if (results.ok()) return *results;
  ParityResult failed{c.component, c.name, "-"};
  failed.error = std::string(results.status().message());
  return {failed};
}

absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path) {
  DRAY_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, " is not JSON"));
  return parsed;
}

std::string ModelPipelineClass(const std::string& folder) {
  const std::filesystem::path index =
      std::filesystem::path(folder).parent_path() / "model" / "model_index.json";
  std::error_code error;
  if (!std::filesystem::exists(index, error)) return "";
  const absl::StatusOr<nlohmann::json> parsed = ReadJsonFile(index.string());
  if (!parsed.ok() || !parsed->is_object() || !parsed->contains("_class_name") ||
      !(*parsed)["_class_name"].is_string())
    return "";
  return (*parsed)["_class_name"].get<std::string>();
}

}  // namespace dray
