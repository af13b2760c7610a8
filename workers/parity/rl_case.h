// The reference cases of the RL algorithms' folders (tests/data/reference/
// flow_grpo, dance_grpo, mix_grpo, ...: a cases.json whose `cases` name
// their inputs and outputs in safetensors files), loaded and compared at
// each case's own tolerance (cases.json `tolerance`, `per_tensor` entries
// by the output's full name or its last name part).
//
//   DRAY_ASSIGN_OR_RETURN(RlCase data, LoadRlCase(c));
//   std::vector<ParityResult> results;
//   CheckAll(c, data, data.spec.at("outputs"), {{"log_prob", step.log_prob}}, "", results);
//
// Thread-safety: an RlCase is immutable; the functions are thread-compatible.
#ifndef DRAY_WORKERS_PARITY_RL_CASE_H_
#define DRAY_WORKERS_PARITY_RL_CASE_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "runtime/io/safetensors.h"
#include "workers/parity/parity_case.h"

namespace dray::rl {

using Outputs = std::map<std::string, at::Tensor>;  // output name -> what dray computed

// RlCase: one case of cases.json with its tensors.
struct RlCase {
  nlohmann::json all;   // the whole cases.json (schedules)
  nlohmann::json spec;  // this case
  std::shared_ptr<const SafetensorsFile> file;

  // Get: a copy of the tensor stored as `tensor_name` (throws if absent,
  // which RunParityCase reports as the case's error).
  at::Tensor Get(const nlohmann::json& tensor_name) const;
  at::Tensor Input(const std::string& name) const { return Get(spec.at("inputs").at(name)); }
  const nlohmann::json& Param(const std::string& name) const { return spec.at("params").at(name); }
};

// LoadRlCase reads case `c.name` of `c.folder`/cases.json and opens its file.
absl::StatusOr<RlCase> LoadRlCase(const ParityCase& c);

// RlCasesIn lists the cases of `folder` whose name's first part ("sde" of
// "sde.nl0.7_s0") has a run in `runs`, in cases.json's order; none unless
// the folder's cases.json names an upstream repository (upstream.repository,
// or one of upstream.<name>.repository) ending in `repository` ("/MixGRPO").
std::vector<ParityCase> RlCasesIn(const std::string& folder, const std::string& repository,
                                  const std::map<std::string, ParityRun>& runs);

// Check compares `actual` with the reference tensor `tensor_name` at the
// case's tolerance for `output`.
void Check(const ParityCase& c, const RlCase& data, const std::string& output,
           const nlohmann::json& tensor_name, const at::Tensor& actual,
           std::vector<ParityResult>& results);

// CheckValue compares `actual` with `expected` (a reference tensor or a
// part of one) at the case's tolerance for `output`.
void CheckValue(const ParityCase& c, const RlCase& data, const std::string& output,
                const at::Tensor& expected, const at::Tensor& actual,
                std::vector<ParityResult>& results);

// CheckAll checks every entry of `names` (output -> tensor name) against
// `computed`, prefixing the output with `prefix`; an output dray did not
// compute fails.
void CheckAll(const ParityCase& c, const RlCase& data, const nlohmann::json& names,
              const Outputs& computed, const std::string& prefix,
              std::vector<ParityResult>& results);

// CheckPart checks the entries of the case's `part` ("info", "derived"),
// computed as "<part>.<name>", but those named in `skip`.
void CheckPart(const ParityCase& c, const RlCase& data, const std::string& part,
               const Outputs& computed, std::vector<ParityResult>& results,
               const std::set<std::string>& skip = {});

// kAcrossNormalKernels bounds how far two CPUs' torch.randn draws from one
// seed lie apart. Both turn the same uniforms into Box-Muller pairs
// r·cos(θ), r·sin(θ) in float32, but with different code: the reference's
// AVX2 kernel (avx_mathfun's log and sincos, θ = float(2π)·u in float) or the
// scalar one that AVX-512 CPUs and ATEN_CPU_CAPABILITY=default run (libm,
// θ rounded once from double). θ then differs by at most 3·2^-24·θ ≤ 1.2e-6,
// cos and sin by that plus 2·2^-22 for the two implementations, and the
// result by r·2^-19 with r ≤ sqrt(2·24·ln 2) = 5.77 (u ≥ 2^-24), the
// radius's and products' roundings included. Measured over 2e7 draws:
// 2.5e-6. A draw with another seed, order, shape or dtype misses by O(1).
constexpr double kAcrossNormalKernels = 5.77 / (1 << 19);

// CheckDraw checks dray's draw of the noise named `tensor_name` (same
// generator, seed and order as upstream) within kAcrossNormalKernels.
void CheckDraw(const ParityCase& c, const RlCase& data, const std::string& output,
               const nlohmann::json& tensor_name, const at::Tensor& drawn,
               std::vector<ParityResult>& results);

}  // namespace dray::rl

#endif  // DRAY_WORKERS_PARITY_RL_CASE_H_
