// The prompts a training job draws from: JSONL rows {"image": PATH,
// "instruction": TEXT, ...}, or for an Edit-Plus model {"images": [PATH,
// ...], ...} with one to three pictures (PATH relative to the file's
// folder; the other fields reach the reward functions; a row may name a
// "target" image, the edit it asks for: SFT's rows must, and the
// `target_psnr` reward compares with it; DPO's rows name a "chosen" and a
// "rejected" edit instead), or the embedded tasks.
//
//   DRAY_ASSIGN_OR_RETURN(std::vector<TrainPrompt> prompts, ReadTrainPrompts("train.jsonl"));
//
// Every row is checked at start: a line that is not a JSON object, a
// missing or unreadable image, a missing instruction, or an image whose
// size differs from the first row's is INVALID_ARGUMENT (NOT_FOUND for a
// missing file) naming the file and line.
#ifndef DRAY_WORKERS_TRAIN_TRAIN_DATA_H_
#define DRAY_WORKERS_TRAIN_TRAIN_DATA_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "dispatch/data_proto.h"

namespace dray {

struct TrainPrompt {
  std::string image_path;
  Bytes image;        // the file's bytes, as sent to the workers
  at::Tensor pixels;  // decoded, uint8 [H, W, 3], for rewards and sample grids
  // Pictures 2 and 3 of an "images" row, as `image_path`, `image`, `pixels`.
  std::vector<std::string> more_image_paths;
  std::vector<Bytes> more_images;
  std::vector<at::Tensor> more_pixels;
  std::string instruction;
  nlohmann::json fields;  // the row's other fields
  Bytes target;           // the edited image the row asks for (DPO: "chosen"), if it names one
  at::Tensor target_pixels;
  Bytes rejected;  // DPO: the edit the row prefers the target over
  at::Tensor rejected_pixels;
  // group: what makes samples comparable (GRPO's group): instruction and images.
  std::string group() const;
  // pictures: every input image's bytes, picture 1 first; picture_pixels:
  // every input image decoded.
  std::vector<Bytes> pictures() const;
  std::vector<at::Tensor> picture_pixels() const;
};

// RowKind: what every row of a job's data must name beside its input.
enum class RowKind {
  kPrompt,      // nothing (GRPO); a "target" where a row names one
  kTarget,      // a "target" image (SFT, the VAE)
  kPreference,  // a "chosen" and a "rejected" image (DPO): `target` and `rejected`
};

// ReadTrainPrompts reads every row and the images `kind` asks for.
absl::StatusOr<std::vector<TrainPrompt>> ReadTrainPrompts(const std::string& jsonl_path,
                                                          RowKind kind = RowKind::kPrompt);

// WriteEmbeddedTask writes the embedded RL task into `dir` and returns
// train.jsonl's path: four 64x64 scenes of the kind the embedded model was
// trained on but never saw (seeds from kFirstEmbeddedTaskScene), each asked
// for an edit it was never taught, with the exact edit as the row's
// "target" (which the target_psnr reward compares with): no one picture
// pays for every input, so the policy cannot collapse onto one.
inline constexpr int64_t kFirstEmbeddedTaskScene = 2000;
inline constexpr char kEmbeddedTaskInstruction[] = "make it yellow";
absl::StatusOr<std::string> WriteEmbeddedTask(const std::string& dir);
// WriteEmbeddedPreferences writes the embedded task as DPO's preference
// pairs into `dir` and returns train.jsonl's path: each scene's exact edit
// "chosen" over the same edit to another colour, "rejected".
inline constexpr char kEmbeddedTaskRejectedEdit[] = "make it blue";
absl::StatusOr<std::string> WriteEmbeddedPreferences(const std::string& dir);

// Synthetic paired edits (SFT's embedded task, and held-out checks of a
// trained model): 64x64 scenes (a sky, the ground, a disc) and the images
// simple instructions turn them into; and one two-picture edit, picture 1's
// scene under the sky of picture 2.
//
// SyntheticScene draws scene `seed` (uint8 [height, width, 3]; the same
// scene at any size, its sun round).
at::Tensor SyntheticScene(int64_t seed, int64_t height, int64_t width);
// The two-picture edit: picture 1 a scene, picture 2 a scene whose sky has
// two colours of any hue (SkyDonorScene), and the result picture 1's scene
// (horizon, ground, disc) under picture 2's sky colours (SceneWithSkyOf).
inline constexpr char kSkyTransferInstruction[] = "give picture 1 the sky of picture 2";
at::Tensor SkyDonorScene(int64_t seed, int64_t height, int64_t width);
at::Tensor SceneWithSkyOf(int64_t seed, int64_t donor_seed, int64_t height, int64_t width);
// ApplyEdit computes what `instruction` (one of SyntheticEditInstructions)
// makes of `scene`: "make it <colour>" blends halfway to the colour, "make
// it darker/brighter" halves the distance to black/white, "turn the sky
// <colour>" recolours the sky's pixels.
absl::StatusOr<at::Tensor> ApplyEdit(const at::Tensor& scene, const std::string& instruction);
const std::vector<std::string>& SyntheticEditInstructions();
// ImageSize: {height, width}.
using ImageSize = std::array<int64_t, 2>;
// WriteSyntheticEditPairs writes scenes first_seed .. first_seed+scenes-1,
// scene i at sizes[i % sizes.size()], each with every instruction's target
// and with `sky_donors` two-picture rows (picture 2 the sky donor of the
// next scenes' seeds), and train.jsonl ({"image" or "images",
// "instruction", "target"} rows) into `dir`; returns train.jsonl's path.
absl::StatusOr<std::string> WriteSyntheticEditPairs(
    const std::string& dir, int64_t scenes, int64_t first_seed,
    const std::vector<ImageSize>& sizes = {{64, 64}}, int64_t sky_donors = 0);

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_TRAIN_DATA_H_
