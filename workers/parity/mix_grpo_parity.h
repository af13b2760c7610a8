// Parity with MixGRPO (Tencent-Hunyuan/MixGRPO): the cases of a folder laid
// out like tests/data/reference/mix_grpo, run through dray's RL numerics:
// the sliding window's tables (MixGrpoWindowAt), MixGRPO's step as dray's
// "sde" step (rollout, recompute with the gradient, and its deterministic
// Euler steps) and its copy of DanceGRPO's step, rollouts through dray's
// sampler around the reference's toy transformer, the loss with its
// log-probability penalty and gradients, and the group advantages
// (trimmed; mixed over several rewards).
//
//   for (const ParityCase& c : MixGrpoParityCases("tests/data/reference/mix_grpo")) ...
//
// Not run, by design: states.random_seeded (numpy's generator draws its
// window starts; MixGRPO itself seeds it from the OS, and dray draws random
// windows from its own seed stream), and the two bf16 step cases (MixGRPO
// multiplies a bfloat16 velocity in bfloat16; dray computes the step in
// float32, as flow_grpo's .float() does).
#ifndef DRAY_WORKERS_PARITY_MIX_GRPO_PARITY_H_
#define DRAY_WORKERS_PARITY_MIX_GRPO_PARITY_H_

#include <string>
#include <vector>

#include "workers/parity/parity_case.h"

namespace dray::rl {

// MixGrpoParityCases lists the cases of `folder`, in cases.json's order
// (none if the folder is not a MixGRPO reference).
std::vector<ParityCase> MixGrpoParityCases(const std::string& folder);

}  // namespace dray::rl

#endif  // DRAY_WORKERS_PARITY_MIX_GRPO_PARITY_H_
