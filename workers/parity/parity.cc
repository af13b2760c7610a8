#include "workers/parity/parity.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "workers/parity/dmd2_parity.h"
#include "workers/parity/dpo_parity.h"
#include "workers/parity/edit_plus_parity.h"
#include "workers/parity/flow_grpo_parity.h"
#include "workers/parity/flux_kontext_parity.h"
#include "workers/parity/mix_grpo_parity.h"
#include "workers/parity/qwen2_vl_parity.h"
#include "workers/parity/qwen_image_parity.h"

namespace dray {
namespace {

namespace fs = std::filesystem;

std::vector<ParityCase> CasesIn(const fs::path& folder) {
  std::vector<ParityCase> cases;
  for (auto family : {qwen_image::QwenImageParityCases, qwen_image::EditPlusParityCases,
                      qwen2_vl::Qwen2VlParityCases, rl::FlowGrpoParityCases, rl::MixGrpoParityCases,
                      rl::DpoParityCases, rl::Dmd2ParityCases, flux::FluxKontextParityCases}) {
    std::vector<ParityCase> found = family(folder.string());
    cases.insert(cases.end(), found.begin(), found.end());
  }
  return cases;
}

}  // namespace

absl::StatusOr<std::vector<ParityCase>> ListParityCases(const std::string& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error))
    return absl::NotFoundError(absl::StrCat(dir, " is not a directory"));
  std::vector<ParityCase> cases = CasesIn(dir);
  std::vector<fs::path> folders;
  for (const auto& entry : fs::recursive_directory_iterator(dir, error)) {
    if (entry.is_directory()) folders.push_back(entry.path());
  }
  std::sort(folders.begin(), folders.end());
  for (const fs::path& folder : folders) {
    std::vector<ParityCase> found = CasesIn(folder);
    cases.insert(cases.end(), found.begin(), found.end());
  }
  if (cases.empty())
    return absl::NotFoundError(
        absl::StrCat(dir, " holds no reference cases (see `dray parity --help`)"));
  return cases;
}

}  // namespace dray
