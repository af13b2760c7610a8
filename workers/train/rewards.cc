#include "workers/train/rewards.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "workers/image/image_codec.h"
#include "workers/models/image_resize.h"
#include "workers/rl/registry.h"

namespace dray {
namespace {

const std::map<std::string, std::array<double, 3>>& Colors() {
  static const auto* colors = new std::map<std::string, std::array<double, 3>>{
      {"red", {255, 0, 0}},      {"green", {0, 255, 0}},    {"blue", {0, 0, 255}},
      {"yellow", {255, 255, 0}}, {"cyan", {0, 255, 255}},   {"magenta", {255, 0, 255}},
      {"orange", {255, 165, 0}}, {"purple", {128, 0, 128}}, {"white", {255, 255, 255}},
      {"black", {0, 0, 0}},      {"gray", {128, 128, 128}},
  };
  return *colors;
}

// TargetColor: the row's target_color field, or the first colour the
// instruction names.
absl::StatusOr<std::array<double, 3>> TargetColor(const RewardInput& in) {
  if (in.fields.is_object() && in.fields.contains("target_color")) {
    const nlohmann::json& target = in.fields["target_color"];
    if (target.is_string()) {
      if (auto color = NamedColor(target.get<std::string>())) return *color;
    } else if (target.is_array() && target.size() == 3 && target[0].is_number() &&
               target[1].is_number() && target[2].is_number()) {
      return std::array<double, 3>{target[0].get<double>(), target[1].get<double>(),
                                   target[2].get<double>()};
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "color reward: target_color must be a colour name or [r, g, b], got ", target.dump()));
  }
  for (absl::string_view word : absl::StrSplit(in.instruction, absl::ByAnyChar(" ,.!?;:"))) {
    if (auto color = NamedColor(absl::AsciiStrToLower(word))) return *color;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("color reward: the row has no target_color and its instruction '",
                   in.instruction, "' names no colour"));
}

absl::StatusOr<double> ColorCloseness(const RewardInput& in) {
  DRAY_ASSIGN_OR_RETURN(auto target, TargetColor(in));
  const at::Tensor mean = in.output.to(at::kDouble).mean(at::IntArrayRef{0, 1});
  const at::Tensor distance = (mean - at::tensor({target[0], target[1], target[2]}, at::kDouble))
                                  .norm()
                                  .div(255.0 * std::sqrt(3.0));
  return 1.0 - distance.item<double>();
}

absl::StatusOr<double> JpegKilobytes(const RewardInput& in) {
  DRAY_ASSIGN_OR_RETURN(std::string jpeg, EncodeJpeg(in.output, /*quality=*/95));
  return static_cast<double>(jpeg.size()) / 1000.0;
}

absl::StatusOr<double> JpegCompressibility(const RewardInput& in) {
  DRAY_ASSIGN_OR_RETURN(double kilobytes, JpegKilobytes(in));
  return -kilobytes;
}

// AtOutputSize: `image` resized to the output's size, to compare them.
absl::StatusOr<at::Tensor> AtOutputSize(const at::Tensor& image, const RewardInput& in) {
  return ResizeImage(image, in.output.size(0), in.output.size(1), Resample::kLanczos);
}

// PsnrOutOf50: the output's PSNR against `reference` (the output's size), in
// dB / 50, at most 2.
double PsnrOutOf50(const RewardInput& in, const at::Tensor& reference) {
  const double mse =
      (in.output.to(at::kDouble) - reference.to(at::kDouble)).pow(2).mean().item<double>();
  const double psnr = mse <= 0 ? 100.0 : 10.0 * std::log10(255.0 * 255.0 / mse);
  return std::min(psnr, 100.0) / 50.0;
}

absl::StatusOr<double> Consistency(const RewardInput& in) {
  DRAY_ASSIGN_OR_RETURN(at::Tensor input, AtOutputSize(in.input, in));
  return PsnrOutOf50(in, input);
}

absl::StatusOr<double> TargetPsnr(const RewardInput& in) {
  if (!in.target.defined()) {
    return absl::InvalidArgumentError(
        "target_psnr reward: the row names no \"target\" image (the edit it asks for)");
  }
  DRAY_ASSIGN_OR_RETURN(at::Tensor target, AtOutputSize(in.target, in));
  return PsnrOutOf50(in, target);
}

// Luminance: an RGB byte image's Rec. 601 luma, float64 [H, W].
at::Tensor Luminance(const at::Tensor& image) {
  const at::Tensor rgb = image.to(at::kDouble);
  return rgb.select(2, 0) * 0.299 + rgb.select(2, 1) * 0.587 + rgb.select(2, 2) * 0.114;
}

absl::StatusOr<double> Structure(const RewardInput& in) {
  DRAY_ASSIGN_OR_RETURN(at::Tensor input, AtOutputSize(in.input, in));
  const at::Tensor a = Luminance(in.output), b = Luminance(input);
  const at::Tensor da = a - a.mean(), db = b - b.mean();
  const double spread = (da.pow(2).sum() * db.pow(2).sum()).sqrt().item<double>();
  if (spread <= 0) return 0.0;  // a flat image keeps no layout
  return std::max(0.0, (da * db).sum().item<double>() / spread);
}

const std::map<std::string, RewardFunction>& Registry() {
  static const auto* registry = new std::map<std::string, RewardFunction>{
      {"color", ColorCloseness},
      {"jpeg_compressibility", JpegCompressibility},
      {"jpeg_incompressibility", JpegKilobytes},
      {"consistency", Consistency},
      {"structure", Structure},
      {"target_psnr", TargetPsnr},
  };
  return *registry;
}

}  // namespace

std::optional<std::array<double, 3>> NamedColor(absl::string_view name) {
  auto found = Colors().find(std::string(name));
  if (found == Colors().end()) return std::nullopt;
  return found->second;
}

absl::StatusOr<RewardFunction> FindRewardFunction(absl::string_view name) {
  return rl::FindRegistered(Registry(), "reward function", name);
}

absl::StatusOr<at::Tensor> ScoreSamples(const std::vector<std::string>& names,
                                        const std::vector<RewardInput>& samples,
                                        const std::function<std::string(size_t)>& where) {
  at::Tensor scores = at::empty(
      {static_cast<int64_t>(samples.size()), static_cast<int64_t>(names.size())}, at::kDouble);
  for (size_t f = 0; f < names.size(); ++f) {
    DRAY_ASSIGN_OR_RETURN(RewardFunction reward, FindRewardFunction(names[f]));
    for (size_t i = 0; i < samples.size(); ++i) {
      absl::StatusOr<double> value = reward(samples[i]);
      if (!value.ok()) {
        return absl::Status(value.status().code(), absl::StrCat("reward ", names[f], ", ", where(i),
                                                                ": ", value.status().message()));
      }
      scores[i][f] = *value;
    }
  }
  return scores;
}

std::vector<std::string> RewardFunctionNames() { return rl::RegisteredNames(Registry()); }

}  // namespace dray
