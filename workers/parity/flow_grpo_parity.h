// Parity with flow_grpo: the cases of a folder laid out like
// tests/data/reference/flow_grpo (a cases.json naming `flow_grpo_files`, and
// the safetensors it lists), run through dray's RL numerics: the SDE step and
// its log-probability (both SDE types, rollout and recompute with the
// gradient), the advantage estimators, the clipped GRPO loss with its KL
// term and gradients, and two Edit-Plus rollouts followed by their training
// steps, run through dray's Edit-Plus pipeline (QwenImageEditPipeline::
// Velocity: the pictures' latents joined, true CFG) around the reference's
// toy transformer (sampler, SDE window, advantages, recomputed log-probs,
// loss and its gradient).
//
//   for (const ParityCase& c : FlowGrpoParityCases("tests/data/reference/flow_grpo")) ...
//
// Tolerances are each case's own (cases.json `tolerance`).
#ifndef DRAY_WORKERS_PARITY_FLOW_GRPO_PARITY_H_
#define DRAY_WORKERS_PARITY_FLOW_GRPO_PARITY_H_

#include <string>
#include <vector>

#include "workers/parity/parity_case.h"

namespace dray::rl {

// FlowGrpoParityCases lists the cases of `folder`, in cases.json's order
// (none if the folder is not a flow_grpo reference).
std::vector<ParityCase> FlowGrpoParityCases(const std::string& folder);

}  // namespace dray::rl

#endif  // DRAY_WORKERS_PARITY_FLOW_GRPO_PARITY_H_
