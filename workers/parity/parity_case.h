// Reference cases and their comparison, shared by every family of parity
// checks (diffusers' Qwen-Image, flow_grpo's RL numerics): a case is a
// named computation that yields one result per output it compares.
//
//   for (const ParityCase& c : cases)
//     for (const ParityResult& r : RunParityCase(c)) ... r.passed ...
//
// Thread-safety: cases are independent; RunParityCase is thread-compatible.
#ifndef DRAY_WORKERS_PARITY_PARITY_CASE_H_
#define DRAY_WORKERS_PARITY_PARITY_CASE_H_

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"

namespace dray {

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

struct ParityCase;
using ParityRun = std::function<absl::StatusOr<std::vector<ParityResult>>(const ParityCase&)>;

// ParityCase: one runnable reference case.
struct ParityCase {
  std::string component;  // what it checks, e.g. "transformer_tiny", "flow_grpo"
  std::string folder;     // where its files are
  std::string name;       // e.g. "case_b", "sde.sde_nl0.7_s0_rollout_f32"
  ParityRun run;
};

// CompareTensors compares `actual` with `expected` elementwise: within
// atol + rtol |expected|, and NaN exactly where the reference has NaN.
ParityResult CompareTensors(const ParityCase& c, std::string output, const at::Tensor& actual,
                            const at::Tensor& expected, double atol, double rtol);

// CaseFilesIn lists one case per case_*.safetensors file of `folder`
// (named by the file's stem), run by `run`, sorted by name.
std::vector<ParityCase> CaseFilesIn(const std::string& component, const std::string& folder,
                                    const ParityRun& run);

// ModelPipelineClass: the pipeline class (model_index.json's _class_name)
// of the model directory beside the case folder `folder` (`../model`), or
// "" where there is none: how a family knows its folders.
std::string ModelPipelineClass(const std::string& folder);

// RunParityCase runs one case; a case that cannot run (missing files, a
// malformed case) yields one failed result carrying the error.
std::vector<ParityResult> RunParityCase(const ParityCase& c);

// ReadJsonFile parses the JSON file at `path`.
absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path);

}  // namespace dray

#endif  // DRAY_WORKERS_PARITY_PARITY_CASE_H_
