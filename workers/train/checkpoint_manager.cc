#include "workers/train/checkpoint_manager.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/files.h"
#include "base/log.h"
#include "base/status_macros.h"

namespace dray {
namespace {

namespace fs = std::filesystem;

// CheckpointStep: N for a complete checkpoint folder named step_N, else -1.
int64_t CheckpointStep(const fs::path& folder) {
  const std::string name = folder.filename().string();
  std::error_code error;
  if (name.rfind("step_", 0) != 0 || !fs::exists(folder / kTrainerStateFile, error)) return -1;
  int64_t step = -1;
  return absl::SimpleAtoi(name.substr(5), &step) ? step : -1;
}

}  // namespace

CheckpointManager::CheckpointManager(const TrainConfig& config)
    : root_((fs::path(config.save_dir) / "checkpoints").string()),
      resume_(config.resume),
      keep_last_(config.keep_last) {}

std::vector<std::string> CheckpointManager::Complete() const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(root_, error)) {
    const int64_t step = CheckpointStep(entry.path());
    if (step >= 0) found.emplace_back(step, entry.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& [step, path] : found) paths.push_back(std::move(path));
  return paths;
}

std::string CheckpointManager::NewestComplete() const {
  const std::vector<std::string> checkpoints = Complete();
  return checkpoints.empty() ? "" : checkpoints.back();
}

absl::StatusOr<std::optional<std::string>> CheckpointManager::ToResume() const {
  if (resume_ == "never") {
    if (Complete().empty()) return std::nullopt;
    return absl::FailedPreconditionError(
        absl::StrCat(fs::path(root_).parent_path().string(),
                     " holds checkpoints of an earlier run: continue it with "
                     "trainer.resume=auto, or use another trainer.save_dir"));
  }
  if (resume_ == "auto") {
    const std::string newest = NewestComplete();
    if (newest.empty()) return std::nullopt;  // a first run
    return newest;
  }
  std::error_code error;
  if (!fs::is_directory(resume_, error)) {
    return absl::NotFoundError(
        absl::StrCat("trainer.resume: ", resume_,
                     " is not a directory (never, auto, or a checkpoint directory "
                     "such as ",
                     (fs::path(root_) / "step_000010").string(), ")"));
  }
  if (!fs::exists(fs::path(resume_) / kTrainerStateFile, error)) {
    return absl::NotFoundError(absl::StrCat(
        "trainer.resume: ", resume_, " is not a complete checkpoint (no ", kTrainerStateFile, ")"));
  }
  return resume_;
}

absl::Status CheckpointManager::SetAsideLaterThan(const std::string& resumed) {
  const int64_t step = CheckpointStep(resumed);
  std::error_code error;
  for (const std::string& later : Complete()) {
    if (CheckpointStep(later) <= step || fs::equivalent(later, resumed, error)) continue;
    const fs::path aside = fs::path(root_) / absl::StrCat("abandoned_after_step_", step);
    fs::create_directories(aside, error);
    fs::rename(later, aside / fs::path(later).filename(), error);
    if (error) {
      return absl::DataLossError(absl::StrCat("cannot set ", later, " aside into ", aside.string(),
                                              ": ", error.message()));
    }
    Log("train", absl::StrCat(later, " is after the resumed step: moved into ", aside.string()));
  }
  return absl::OkStatus();
}

void CheckpointManager::RemovePartial() const {
  std::error_code ignored;
  for (const auto& entry : fs::directory_iterator(root_, ignored)) {
    if (entry.path().extension() == ".partial") fs::remove_all(entry.path(), ignored);
  }
}

absl::Status CheckpointManager::Save(int64_t steps, const nlohmann::json& state,
                                     const SaveShards& save_shards) {
  const fs::path complete = fs::path(root_) / absl::StrFormat("step_%06d", steps);
  std::error_code error;
  if (fs::exists(complete / kTrainerStateFile, error)) return absl::OkStatus();
  const fs::path partial = fs::path(root_) / absl::StrFormat(".step_%06d.partial", steps);
  fs::remove_all(partial, error);
  fs::create_directories(partial, error);
  if (error) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", partial.string(), ": ", error.message()));
  }
  DRAY_RETURN_IF_ERROR(save_shards(partial.string()));
  DRAY_RETURN_IF_ERROR(WriteFileAtomically((partial / kTrainerStateFile).string(), state.dump()));
  DRAY_RETURN_IF_ERROR(SyncToDisk(partial.string()));
  fs::rename(partial, complete, error);  // complete all at once, or not at all
  if (error) {
    return absl::DataLossError(absl::StrCat("cannot rename ", partial.string(), " to ",
                                            complete.string(), ": ", error.message()));
  }
  DRAY_RETURN_IF_ERROR(SyncToDisk(root_));  // the rename too, before older ones go
  const std::vector<std::string> kept = Complete();
  for (size_t i = 0; i + keep_last_ < kept.size(); ++i) fs::remove_all(kept[i], error);
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::json> CheckpointManager::ReadState(const std::string& checkpoint) {
  const std::string path = (fs::path(checkpoint) / kTrainerStateFile).string();
  DRAY_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  nlohmann::json state = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!state.is_object() || !state.contains("history") || !state["history"].is_array())
    return absl::DataLossError(absl::StrCat(path, " is not a trainer state"));
  return state;
}

}  // namespace dray
