#include "workers/train/train_data.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "workers/image/image_codec.h"
#include "workers/pipeline/edit_batch.h"

namespace dray {
namespace {

namespace fs = std::filesystem;

absl::Status BadLine(const std::string& path, int line, const std::string& why,
                     absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
  return absl::Status(code, absl::StrCat(path, ":", line, ": ", why));
}

// WriteEmbeddedRows writes the embedded task's scenes and their exact edits
// into `dir`, one train.jsonl row each: {"image", "instruction", <edit_key>:
// the edit} and, with `rejected`, the scene made blue as "rejected".
absl::StatusOr<std::string> WriteEmbeddedRows(const std::string& dir, const char* edit_key,
                                              bool rejected) {
  std::string jsonl;
  for (int64_t seed = kFirstEmbeddedTaskScene; seed < kFirstEmbeddedTaskScene + 4; ++seed) {
    const at::Tensor scene = SyntheticScene(seed, 64, 64);
    DRAY_ASSIGN_OR_RETURN(at::Tensor target, ApplyEdit(scene, kEmbeddedTaskInstruction));
    const std::string file = absl::StrCat("scene_", seed, ".png");
    const std::string target_file = absl::StrCat("scene_", seed, "_yellow.png");
    DRAY_RETURN_IF_ERROR(WritePngFile((fs::path(dir) / file).string(), scene));
    DRAY_RETURN_IF_ERROR(WritePngFile((fs::path(dir) / target_file).string(), target));
    nlohmann::json row = {
        {"image", file}, {"instruction", kEmbeddedTaskInstruction}, {edit_key, target_file}};
    if (rejected) {  // the edit of another colour
      DRAY_ASSIGN_OR_RETURN(at::Tensor wrong, ApplyEdit(scene, kEmbeddedTaskRejectedEdit));
      row["rejected"] = absl::StrCat("scene_", seed, "_blue.png");
      DRAY_RETURN_IF_ERROR(
          WritePngFile((fs::path(dir) / row["rejected"].get<std::string>()).string(), wrong));
    }
    absl::StrAppend(&jsonl, row.dump(), "\n");
  }
  const std::string path = (fs::path(dir) / "train.jsonl").string();
  DRAY_RETURN_IF_ERROR(WriteFile(path, jsonl));
  return path;
}

}  // namespace

absl::StatusOr<std::vector<TrainPrompt>> ReadTrainPrompts(const std::string& jsonl_path,
                                                          RowKind kind) {
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
    // ReadImage reads the image the row names under `key`.
    auto read_image = [&](const char* key, std::string& path, Bytes& bytes,
                          at::Tensor& pixels) -> absl::Status {
      if (!row.contains(key) || !row[key].is_string()) {
        return BadLine(jsonl_path, line, absl::StrCat("the row has no \"", key, "\" (a path)"));
      }
      const fs::path named = row[key].get<std::string>();
      path = (named.is_absolute() ? named : folder / named).string();
      absl::StatusOr<std::string> read = ReadFile(path);
      if (!read.ok()) {
        return BadLine(jsonl_path, line, absl::StrCat("cannot read ", key, " ", path),
                       absl::StatusCode::kNotFound);
      }
      absl::StatusOr<at::Tensor> decoded = DecodeImage(*read);
      if (!decoded.ok())
        return BadLine(jsonl_path, line, absl::StrCat(path, ": ", decoded.status().message()));
      bytes = Bytes(*std::move(read));
      pixels = *std::move(decoded);
      row.erase(key);
      return absl::OkStatus();
    };
    TrainPrompt prompt;
    if (row.contains("images")) {
      const nlohmann::json images = row["images"];
      if (row.contains("image") || !images.is_array() || images.empty() ||
          images.size() > static_cast<size_t>(kMaxPictures)) {
        return BadLine(jsonl_path, line,
                       absl::StrCat("\"images\" must be a list of 1 to ", kMaxPictures,
                                    " paths, and the row must not also name an \"image\""));
      }
      for (size_t p = 0; p < images.size(); ++p) {
        row["image"] = images[p];
        std::string path;
        Bytes bytes;
        at::Tensor pixels;
        DRAY_RETURN_IF_ERROR(read_image("image", path, bytes, pixels));
        if (p == 0) {
          prompt.image_path = path;
          prompt.image = bytes;
          prompt.pixels = pixels;
        } else {
          prompt.more_image_paths.push_back(path);
          prompt.more_images.push_back(bytes);
          prompt.more_pixels.push_back(pixels);
        }
      }
      row.erase("images");
    } else {
      DRAY_RETURN_IF_ERROR(read_image("image", prompt.image_path, prompt.image, prompt.pixels));
    }
    std::string path;
    if (kind == RowKind::kPreference) {
      DRAY_RETURN_IF_ERROR(read_image("chosen", path, prompt.target, prompt.target_pixels));
      DRAY_RETURN_IF_ERROR(read_image("rejected", path, prompt.rejected, prompt.rejected_pixels));
    } else if (kind == RowKind::kTarget || row.contains("target")) {
      DRAY_RETURN_IF_ERROR(read_image("target", path, prompt.target, prompt.target_pixels));
    }
    prompt.instruction = row["instruction"].get<std::string>();
    row.erase("instruction");
    prompt.fields = std::move(row);
    prompts.push_back(std::move(prompt));
  }
  if (prompts.empty()) return absl::InvalidArgumentError(absl::StrCat(jsonl_path, " has no rows"));
  return prompts;
}

std::string TrainPrompt::group() const {
  std::string group = instruction + "\n" + image_path;
  for (const std::string& path : more_image_paths) absl::StrAppend(&group, "\n", path);
  return group;
}

std::vector<Bytes> TrainPrompt::pictures() const {
  std::vector<Bytes> all = {image};
  all.insert(all.end(), more_images.begin(), more_images.end());
  return all;
}

std::vector<at::Tensor> TrainPrompt::picture_pixels() const {
  std::vector<at::Tensor> all = {pixels};
  all.insert(all.end(), more_pixels.begin(), more_pixels.end());
  return all;
}

absl::StatusOr<std::string> WriteEmbeddedTask(const std::string& dir) {
  return WriteEmbeddedRows(dir, "target", /*rejected=*/false);
}

absl::StatusOr<std::string> WriteEmbeddedPreferences(const std::string& dir) {
  return WriteEmbeddedRows(dir, "chosen", /*rejected=*/true);
}

namespace {

// SceneLayout: what a synthetic scene is made of (colours in 0..255,
// positions as shares of the height and width).
struct SceneLayout {
  double horizon;
  at::Tensor sky_top, sky_low, ground;  // RGB [3]
  double cx, cy, r;                     // the disc: centre and radius (of the shorter side)
  at::Tensor disc_colour;
};

// Uniform draws numbers from seed's generator, in order.
class Uniform {
 public:
  explicit Uniform(int64_t seed) : generator_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}
  double operator()(double lo, double hi) {
    return lo + (hi - lo) * at::rand({1}, generator_).item<double>();
  }
  at::Tensor Colour(std::array<double, 2> r, std::array<double, 2> g, std::array<double, 2> b) {
    return at::tensor({(*this)(r[0], r[1]), (*this)(g[0], g[1]), (*this)(b[0], b[1])});  // in order
  }

 private:
  at::Generator generator_;
};

SceneLayout LayoutOfScene(int64_t seed) {
  Uniform uniform(seed);
  SceneLayout layout;
  layout.horizon = uniform(0.45, 0.65);
  layout.sky_top = uniform.Colour({60, 110}, {120, 170}, {200, 250});
  layout.sky_low = uniform.Colour({170, 220}, {190, 230}, {220, 250});
  layout.ground = uniform.Colour({50, 140}, {100, 160}, {40, 90});
  layout.cx = uniform(0.2, 0.8);
  layout.cy = uniform(0.15, 0.8);
  layout.r = uniform(0.08, 0.16);
  layout.disc_colour = uniform.Colour({180, 255}, {120, 230}, {20, 120});
  return layout;
}

// VividSky: sky donor `seed`'s two sky colours, of any hue (drawn from a
// stream of their own, so the donor's scene is scene `seed`).
std::pair<at::Tensor, at::Tensor> VividSky(int64_t seed) {
  Uniform uniform(seed ^ 0x5ca1ab1e);
  at::Tensor top = uniform.Colour({20, 250}, {20, 250}, {20, 250});
  at::Tensor low = uniform.Colour({20, 250}, {20, 250}, {20, 250});
  return {top, low};
}

at::Tensor DrawScene(const SceneLayout& layout, int64_t height, int64_t width) {
  const at::Tensor y = at::arange(height, at::kFloat).view({height, 1, 1}) / height;
  const at::Tensor x = at::arange(width, at::kFloat).view({1, width, 1}) / width;
  const at::Tensor t = (y / layout.horizon).clamp(0, 1);
  at::Tensor image = at::where(y < layout.horizon, layout.sky_top * (1 - t) + layout.sky_low * t,
                               layout.ground * (1.1 - 0.4 * (y - layout.horizon)));
  // A sun or a ball: a disc of its own colour.
  const double side = std::min(height, width);  // the disc's radius is r of the shorter side
  const at::Tensor disc =
      ((x - layout.cx).mul(width / side).pow(2) + (y - layout.cy).mul(height / side).pow(2))
          .lt(layout.r * layout.r);
  image = at::where(disc, layout.disc_colour.view({1, 1, 3}).expand_as(image), image);
  return image.clamp(0, 255).round().to(at::kByte).contiguous();
}

}  // namespace

at::Tensor SyntheticScene(int64_t seed, int64_t height, int64_t width) {
  return DrawScene(LayoutOfScene(seed), height, width);
}

at::Tensor SkyDonorScene(int64_t seed, int64_t height, int64_t width) {
  return SceneWithSkyOf(seed, seed, height, width);
}

at::Tensor SceneWithSkyOf(int64_t seed, int64_t donor_seed, int64_t height, int64_t width) {
  SceneLayout layout = LayoutOfScene(seed);
  std::tie(layout.sky_top, layout.sky_low) = VividSky(donor_seed);
  return DrawScene(layout, height, width);
}

absl::StatusOr<at::Tensor> ApplyEdit(const at::Tensor& scene, const std::string& instruction) {
  const at::Tensor image = scene.to(at::kFloat);
  static const std::map<std::string, std::array<float, 3>> kColours = {
      {"red", {220, 40, 40}},     {"green", {40, 180, 60}},   {"blue", {40, 80, 220}},
      {"purple", {140, 50, 200}}, {"yellow", {230, 210, 40}}, {"orange", {240, 140, 30}}};
  at::Tensor edited;
  if (instruction == "make it darker") {
    edited = image * 0.5;
  } else if (instruction == "make it brighter") {
    edited = 255 - (255 - image) * 0.5;
  } else if (instruction.rfind("make it ", 0) == 0 && kColours.count(instruction.substr(8))) {
    const auto& c = kColours.at(instruction.substr(8));
    edited = 0.5 * image + 0.5 * at::tensor({c[0], c[1], c[2]}).view({1, 1, 3});
  } else if (instruction.rfind("turn the sky ", 0) == 0 && kColours.count(instruction.substr(13))) {
    // The sky: bluish pixels above the middle.
    const auto& c = kColours.at(instruction.substr(13));
    const int64_t size = image.size(0);
    const at::Tensor upper = (at::arange(size).view({size, 1}) < size * 0.66);
    const at::Tensor bluish = image.select(2, 2) > image.select(2, 0) + 20;
    const at::Tensor sky = (upper & bluish).unsqueeze(2);
    const at::Tensor shade = image.mean(2, /*keepdim=*/true) / 200;
    edited = at::where(sky, shade * at::tensor({c[0], c[1], c[2]}).view({1, 1, 3}), image);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("no synthetic edit for '", instruction, "'"));
  }
  return edited.clamp(0, 255).round().to(at::kByte).contiguous();
}

const std::vector<std::string>& SyntheticEditInstructions() {
  static const std::vector<std::string> kInstructions = {
      "make it purple", "make it red",      "make it blue",     "make it green",
      "make it darker", "make it brighter", "turn the sky red", "turn the sky orange"};
  return kInstructions;
}

absl::StatusOr<std::string> WriteSyntheticEditPairs(const std::string& dir, int64_t scenes,
                                                    int64_t first_seed,
                                                    const std::vector<ImageSize>& sizes,
                                                    int64_t sky_donors) {
  if (sizes.empty()) return absl::InvalidArgumentError("no scene sizes given");
  if (sky_donors < 0 || sky_donors >= scenes)
    return absl::InvalidArgumentError("sky_donors must lie in [0, scenes)");
  std::string jsonl;
  auto add_row = [&](nlohmann::json pictures, const std::string& instruction,
                     const std::string& target) {
    const char* key = pictures.size() == 1 ? "image" : "images";
    nlohmann::json row = {{key, pictures.size() == 1 ? pictures[0] : pictures},
                          {"instruction", instruction},
                          {"target", target}};
    absl::StrAppend(&jsonl, row.dump(), "\n");
  };
  auto write = [&](const std::string& file, const at::Tensor& image) {
    return WritePngFile((fs::path(dir) / file).string(), image);
  };
  for (int64_t i = 0; i < scenes; ++i) {
    const auto [height, width] = sizes[i % sizes.size()];
    const int64_t seed = first_seed + i;
    const at::Tensor scene = SyntheticScene(seed, height, width);
    const std::string file = absl::StrCat("scene_", seed, ".png");
    DRAY_RETURN_IF_ERROR(write(file, scene));
    for (size_t e = 0; e < SyntheticEditInstructions().size(); ++e) {
      const std::string& instruction = SyntheticEditInstructions()[e];
      DRAY_ASSIGN_OR_RETURN(at::Tensor target, ApplyEdit(scene, instruction));
      const std::string target_file = absl::StrCat("scene_", seed, "_edit_", e, ".png");
      DRAY_RETURN_IF_ERROR(write(target_file, target));
      add_row({file}, instruction, target_file);
    }
    for (int64_t k = 0; k < sky_donors; ++k) {  // the next scenes' seeds, with vivid skies
      const int64_t donor = first_seed + (i + 1 + k) % scenes;
      const std::string donor_file = absl::StrCat("sky_", donor, "_", height, "x", width, ".png");
      const std::string target_file = absl::StrCat("scene_", seed, "_sky_of_", donor, ".png");
      DRAY_RETURN_IF_ERROR(write(donor_file, SkyDonorScene(donor, height, width)));
      DRAY_RETURN_IF_ERROR(write(target_file, SceneWithSkyOf(seed, donor, height, width)));
      add_row({file, donor_file}, kSkyTransferInstruction, target_file);
    }
  }
  const std::string path = (fs::path(dir) / "train.jsonl").string();
  DRAY_RETURN_IF_ERROR(WriteFile(path, jsonl));
  return path;
}

}  // namespace dray
