// The prompts a training job draws from: JSONL rows {"image": PATH,
// "instruction": TEXT, ...} (PATH relative to the file's folder; the other
// fields reach the reward functions), or the embedded task.
//
//   DRAY_ASSIGN_OR_RETURN(std::vector<TrainPrompt> prompts, ReadTrainPrompts("train.jsonl"));
//
// Every row is checked at start: a line that is not a JSON object, a
// missing or unreadable image, a missing instruction, or an image whose
// size differs from the first row's is INVALID_ARGUMENT (NOT_FOUND for a
// missing file) naming the file and line.
#ifndef DRAY_WORKERS_TRAIN_TRAIN_DATA_H_
#define DRAY_WORKERS_TRAIN_TRAIN_DATA_H_

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
  std::string instruction;
  nlohmann::json fields;  // the row's other fields
  // group: what makes samples comparable (GRPO's group): instruction and image.
  std::string group() const { return instruction + "\n" + image_path; }
};

absl::StatusOr<std::vector<TrainPrompt>> ReadTrainPrompts(const std::string& jsonl_path);

// WriteEmbeddedTask writes the embedded task into `dir` (train.jsonl and its
// images: four patterned 64x64 images, each asked in other words to become
// blue, with target_color set) and returns train.jsonl's path.
absl::StatusOr<std::string> WriteEmbeddedTask(const std::string& dir);

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_TRAIN_DATA_H_
