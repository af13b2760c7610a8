// Parity with diffusers: runs reference cases laid out like
// shared/reference/qwen_image (see its README) and compares dray's outputs.
//
// A reference directory holds component folders, recognized by content:
//   scheduler/   scheduler_config.json + cases.json (schedules, Euler steps)
//   helpers/     cases.json + pack_unpack.safetensors
//   any folder whose config.json has _class_name QwenImageTransformer2DModel
//     or AutoencoderKLQwenImage, with case_*.safetensors files
// Other folders are skipped.
//
//   DRAY_ASSIGN_OR_RETURN(std::vector<ParityCase> cases, ListParityCases(dir));
//   for (const ParityCase& c : cases)
//     for (const ParityResult& r : RunParityCase(c)) ... r.passed ...
//
// Tolerances are the reference README's: transformer and VAE outputs
// atol = rtol = 1e-5; scheduler sigmas atol 1e-7, timesteps 1e-4, Euler steps
// 1e-6; helpers exact.
#ifndef DRAY_WORKERS_MODELS_QWEN_IMAGE_PARITY_H_
#define DRAY_WORKERS_MODELS_QWEN_IMAGE_PARITY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dray::qwen_image {

// ParityCase: one runnable reference case.
struct ParityCase {
  enum class Kind { kScheduleCase, kSchedulerSteps, kHelpers, kTransformer, kVae };
  Kind kind;
  std::string component;  // folder name, e.g. "transformer_tiny"
  std::string folder;     // its path
  std::string name;       // e.g. "case_b", "schedule_2", "steps"
};

// ParityResult: one output of one case compared with the reference.
struct ParityResult {
  std::string component;
  std::string case_name;
  std::string output;  // e.g. "sample", "sigmas"
  double max_abs = 0;  // max |dray - reference|
  double max_rel = 0;  // max |dray - reference| / |reference|, where |reference| > atol
  double atol = 0;
  double rtol = 0;
  bool passed = false;  // |dray - reference| <= atol + rtol |reference| everywhere
  std::string error;    // why the case could not run (then passed is false)
};

// ListParityCases finds every case under `dir`, sorted by component and name.
absl::StatusOr<std::vector<ParityCase>> ListParityCases(const std::string& dir);

// RunParityCase runs one case; a case that cannot run yields one failed
// result carrying the error.
std::vector<ParityResult> RunParityCase(const ParityCase& parity_case);

}  // namespace dray::qwen_image

#endif  // DRAY_WORKERS_MODELS_QWEN_IMAGE_PARITY_H_
