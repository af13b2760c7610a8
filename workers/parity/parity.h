// Every reference case under a folder: diffusers' Qwen-Image components
// (workers/parity/qwen_image_parity.h), transformers' Qwen2.5-VL text
// encoder and image processor (workers/parity/qwen2_vl_parity.h) and
// flow_grpo's RL numerics (workers/parity/flow_grpo_parity.h), recognized by content in the folder
// itself and in every folder below it. What `dray parity --reference DIR` runs.
//
//   DRAY_ASSIGN_OR_RETURN(std::vector<ParityCase> cases, ListParityCases(dir));
//   for (const ParityCase& c : cases) for (const ParityResult& r : RunParityCase(c)) ...
#ifndef DRAY_WORKERS_PARITY_PARITY_H_
#define DRAY_WORKERS_PARITY_PARITY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "workers/parity/parity_case.h"

namespace dray {

// ListParityCases finds every case in `dir`, then in the folders below it
// in path order. NOT_FOUND if `dir` is not a folder or holds no case.
absl::StatusOr<std::vector<ParityCase>> ListParityCases(const std::string& dir);

}  // namespace dray

#endif  // DRAY_WORKERS_PARITY_PARITY_H_
