// Parity with Diffusion-DPO: the cases of a folder laid out like
// tests/data/reference/flow_dpo (flow_grpo's flow-matching DPO and the
// DiffusionDPO authors' epsilon-prediction loss), run through
// rl::DpoLoss and rl::DpoPairs: each pair's shared noise and the velocity (or noise)
// target, the errors of policy and reference, the preference margin, the
// loss, the implicit accuracy and the gradient.
//
//   for (const ParityCase& c : DpoParityCases("tests/data/reference/flow_dpo")) ...
//
// Not compared, by design: flow_grpo's timestep indices, timesteps, sigmas
// and noised latents (from SD3's shift-3 training table: dray noises with
// the model's own schedule, workers/train/sft.h), its logged w_diff and
// l_diff (the margin grouped the other way; dray's w_l_diff is compared),
// the pair counts and logged raw losses. The `tracker` cases check
// rl::DpoPairs, flow_grpo's choice of pairs from a policy's own samples.
#ifndef DRAY_WORKERS_PARITY_DPO_PARITY_H_
#define DRAY_WORKERS_PARITY_DPO_PARITY_H_

#include <string>
#include <vector>

#include "workers/parity/parity_case.h"

namespace dray::rl {

// DpoParityCases lists the cases of `folder`, in cases.json's order (none
// if the folder is not a Diffusion-DPO reference).
std::vector<ParityCase> DpoParityCases(const std::string& folder);

}  // namespace dray::rl

#endif  // DRAY_WORKERS_PARITY_DPO_PARITY_H_
