#include "workers/train/train_data.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "workers/image/image_codec.h"

namespace dray {
namespace {

namespace fs = std::filesystem;

absl::Status BadLine(const std::string& path, int line, const std::string& why,
                     absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
  return absl::Status(code, absl::StrCat(path, ":", line, ": ", why));
}

}  // namespace

absl::StatusOr<std::vector<TrainPrompt>> ReadTrainPrompts(const std::string& jsonl_path) {
  std::ifstream in(jsonl_path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read data.train_files ", jsonl_path));
  const fs::path folder = fs::path(jsonl_path).parent_path();
  std::vector<TrainPrompt> prompts;
  std::string text;
  for (int line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json row = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!row.is_object()) return BadLine(jsonl_path, line, "not a JSON object");
    if (!row.contains("instruction") || !row["instruction"].is_string() ||
        row["instruction"].get<std::string>().empty()) {
      return BadLine(jsonl_path, line, "the row has no \"instruction\" (a non-empty string)");
    }
    if (!row.contains("image") || !row["image"].is_string()) {
      return BadLine(jsonl_path, line, "the row has no \"image\" (a path)");
    }
    TrainPrompt prompt;
    const fs::path image = row["image"].get<std::string>();
    prompt.image_path = (image.is_absolute() ? image : folder / image).string();
    absl::StatusOr<std::string> bytes = ReadFile(prompt.image_path);
    if (!bytes.ok()) {
      return BadLine(jsonl_path, line, absl::StrCat("cannot read image ", prompt.image_path),
                     absl::StatusCode::kNotFound);
    }
    absl::StatusOr<at::Tensor> pixels = DecodeImage(*bytes);
    if (!pixels.ok()) {
      return BadLine(jsonl_path, line,
                     absl::StrCat(prompt.image_path, ": ", pixels.status().message()));
    }
    if (!prompts.empty() && pixels->sizes() != prompts.front().pixels.sizes()) {
      return BadLine(
          jsonl_path, line,
          absl::StrCat(prompt.image_path, " is ", pixels->size(1), "x", pixels->size(0),
                       ", the first row's image ", prompts.front().pixels.size(1), "x",
                       prompts.front().pixels.size(0), ": a job's images must share one size"));
    }
    prompt.image = Bytes(*std::move(bytes));
    prompt.pixels = *std::move(pixels);
    prompt.instruction = row["instruction"].get<std::string>();
    row.erase("image");
    row.erase("instruction");
    prompt.fields = std::move(row);
    prompts.push_back(std::move(prompt));
  }
  if (prompts.empty()) return absl::InvalidArgumentError(absl::StrCat(jsonl_path, " has no rows"));
  return prompts;
}

absl::StatusOr<std::string> WriteEmbeddedTask(const std::string& dir) {
  // One colour, worded four ways: the tiny random model learns a shared
  // shift of its outputs' colour within minutes (per-colour conditioning
  // would take far longer).
  const std::vector<std::pair<std::string, std::string>> tasks = {{"make it blue", "blue"},
                                                                  {"turn it blue", "blue"},
                                                                  {"paint it blue", "blue"},
                                                                  {"colour it blue", "blue"}};
  std::string jsonl;
  const at::Tensor y = at::arange(64, at::kFloat).view({64, 1, 1});
  const at::Tensor x = at::arange(64, at::kFloat).view({1, 64, 1});
  for (size_t i = 0; i < tasks.size(); ++i) {
    // A soft pattern per prompt, mid-gray on average, so no colour is given away.
    const at::Tensor phase = at::tensor({0.0f, 2.1f, 4.2f}).view({1, 1, 3}) + static_cast<float>(i);
    const at::Tensor image =
        (128 + 60 * at::sin(x / (6.0 + i) + phase) * at::cos(y / (9.0 - i) + phase))
            .clamp(0, 255)
            .to(at::kByte)
            .contiguous();
    const std::string file = absl::StrCat("pattern_", i, ".png");
    DRAY_RETURN_IF_ERROR(WritePngFile((fs::path(dir) / file).string(), image));
    absl::StrAppend(
        &jsonl,
        nlohmann::json{
            {"image", file}, {"instruction", tasks[i].first}, {"target_color", tasks[i].second}}
            .dump(),
        "\n");
  }
  const std::string path = (fs::path(dir) / "train.jsonl").string();
  DRAY_RETURN_IF_ERROR(WriteFile(path, jsonl));
  return path;
}

}  // namespace dray
