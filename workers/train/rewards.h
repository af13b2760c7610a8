// Reward functions for training, registered by name (`worker.reward.functions`)
// so that a new one is a small function and one line in rewards.cc. None
// needs model weights:
//
//   color                  closeness of the output's mean colour to the row's
//                          `target_color` (a name or [r, g, b]) or else to the
//                          colour the instruction names: 1 - distance / max
//   jpeg_compressibility   -(kilobytes of the output as JPEG, quality 95)
//   jpeg_incompressibility +(the same)
//   consistency            PSNR of the output against the input (resized to
//                          the output's size), in dB / 50: "edit only what
//                          was asked"
//   structure              correlation of the output's luminance with the
//                          input's (resized), clamped to [0, 1]: the input's
//                          layout kept, whatever its colours became
//   target_psnr            PSNR of the output against the row's "target"
//                          image (the edit it asks for, resized), in dB / 50
//
//   DRAY_ASSIGN_OR_RETURN(RewardFunction color, FindRewardFunction("color"));
//   DRAY_ASSIGN_OR_RETURN(double reward, color({output, input, instruction, fields}));
//
// A row a function cannot score (no colour named, no target, say) is
// INVALID_ARGUMENT naming what is missing.
//
// Thread-safety: pure functions.
#ifndef DRAY_WORKERS_TRAIN_REWARDS_H_
#define DRAY_WORKERS_TRAIN_REWARDS_H_

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dray {

// RewardInput: one sample to score.
struct RewardInput {
  at::Tensor output;  // the edited image, uint8 [H, W, 3]
  at::Tensor input;   // the image it was asked to edit, uint8 [h, w, 3]
  std::string instruction;
  nlohmann::json fields;  // the data row's other fields (an object)
  at::Tensor target;      // the row's "target" image, uint8 [h, w, 3]; undefined if none
};

using RewardFunction = std::function<absl::StatusOr<double>(const RewardInput&)>;

// FindRewardFunction returns the function registered as `name`; NOT_FOUND
// lists the registered names.
absl::StatusOr<RewardFunction> FindRewardFunction(absl::string_view name);

// ScoreSamples scores every sample with each function `names` names:
// [samples, functions] float64. A sample a function cannot score fails the
// call, naming the function and `where(i)` (e.g. "sample 3 (a.png)").
absl::StatusOr<at::Tensor> ScoreSamples(const std::vector<std::string>& names,
                                        const std::vector<RewardInput>& samples,
                                        const std::function<std::string(size_t)>& where);

// RewardFunctionNames lists the registered names, sorted.
std::vector<std::string> RewardFunctionNames();

// NamedColor returns the RGB of a colour name dray knows (red, green, blue,
// yellow, cyan, magenta, orange, purple, white, black, gray), or nothing.
std::optional<std::array<double, 3>> NamedColor(absl::string_view name);

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_REWARDS_H_
