#include "workers/parity/rl_case.h"

#include <filesystem>
#include <stdexcept>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace dray::rl {

namespace fs = std::filesystem;
using nlohmann::json;

at::Tensor RlCase::Get(const json& tensor_name) const {
  absl::StatusOr<at::Tensor> tensor = file->Get(tensor_name.get<std::string>());
  if (!tensor.ok()) throw std::runtime_error(std::string(tensor.status().message()));
  return tensor->clone();
}

absl::StatusOr<RlCase> LoadRlCase(const ParityCase& c) {
  RlCase data;
  DRAY_ASSIGN_OR_RETURN(data.all, ReadJsonFile((fs::path(c.folder) / "cases.json").string()));
  for (const json& spec : data.all.at("cases")) {
    if (spec.at("name") == c.name) data.spec = spec;
  }
  if (data.spec.is_null()) return absl::NotFoundError(absl::StrCat("no case ", c.name));
  DRAY_ASSIGN_OR_RETURN(
      data.file, SafetensorsFile::Open(
                     (fs::path(c.folder) / data.spec.at("file").get<std::string>()).string()));
  return data;
}

std::vector<ParityCase> RlCasesIn(const std::string& folder, const std::string& repository,
                                  const std::map<std::string, ParityRun>& runs) {
  const absl::StatusOr<json> all = ReadJsonFile((fs::path(folder) / "cases.json").string());
  if (!all.ok() || !all->is_object() || !all->contains("cases")) return {};
  // The upstream repository, or one of several (upstream.<name>.repository).
  bool named = false;
  const json upstream = all->value("upstream", json::object());
  if (upstream.is_object()) {
    named = absl::EndsWith(upstream.value("repository", ""), repository);
    for (const auto& [key, source] : upstream.items()) {
      if (source.is_object())
        named = named || absl::EndsWith(source.value("repository", ""), repository);
    }
  }
  // The flow_grpo set predates the `upstream` field: it names flow_grpo_files.
  const bool legacy_flow_grpo = repository == "/flow_grpo" && all->contains("flow_grpo_files");
  if (!named && !legacy_flow_grpo) return {};
  const std::string component = fs::path(folder).filename().string();
  std::vector<ParityCase> cases;
  for (const json& spec : (*all)["cases"]) {
    const std::string name = spec.value("name", "");
    auto run = runs.find(name.substr(0, name.find('.')));
    if (run != runs.end()) cases.push_back({component, folder, name, run->second});
  }
  return cases;
}

void Check(const ParityCase& c, const RlCase& data, const std::string& output,
           const nlohmann::json& tensor_name, const at::Tensor& actual,
           std::vector<ParityResult>& results) {
  CheckValue(c, data, output, data.Get(tensor_name), actual, results);
}

void CheckValue(const ParityCase& c, const RlCase& data, const std::string& output,
                const at::Tensor& expected, const at::Tensor& actual,
                std::vector<ParityResult>& results) {
  const json& tolerance = data.spec.at("tolerance");
  // A per-tensor tolerance by the output's full name, else by its last part.
  const std::string key = output.substr(output.rfind('.') + 1);
  const json per_tensor = tolerance.value("per_tensor", json::object());
  const json& chosen = per_tensor.contains(output) ? per_tensor[output]
                       : per_tensor.contains(key)  ? per_tensor[key]
                                                   : tolerance.at("default");
  if (!actual.defined()) {
    ParityResult missing{c.component, c.name, output};
    missing.error = "dray computed no such output";
    results.push_back(missing);
    return;
  }
  results.push_back(CompareTensors(c, output, actual, expected, chosen.at("atol").get<double>(),
                                   chosen.at("rtol").get<double>()));
}

void CheckAll(const ParityCase& c, const RlCase& data, const nlohmann::json& names,
              const Outputs& computed, const std::string& prefix,
              std::vector<ParityResult>& results) {
  for (const auto& [output, tensor_name] : names.items()) {
    if (!tensor_name.is_string()) continue;
    auto found = computed.find(output);
    Check(c, data, prefix + output, tensor_name,
          found == computed.end() ? at::Tensor() : found->second, results);
  }
}

void CheckPart(const ParityCase& c, const RlCase& data, const std::string& part,
               const Outputs& computed, std::vector<ParityResult>& results,
               const std::set<std::string>& skip) {
  json named;
  for (const auto& [name, tensor_name] : data.spec.at(part).items()) {
    if (skip.count(name) == 0) named[part + "." + name] = tensor_name;
  }
  CheckAll(c, data, named, computed, "", results);
}

void CheckDraw(const ParityCase& c, const RlCase& data, const std::string& output,
               const nlohmann::json& tensor_name, const at::Tensor& drawn,
               std::vector<ParityResult>& results) {
  results.push_back(
      CompareTensors(c, output, drawn, data.Get(tensor_name), kAcrossNormalKernels, 0));
}

}  // namespace dray::rl
