// ScoreEdits: how well the model edits a step's rows now, by the job's
// reward functions (worker.reward.functions, weighted): what algorithms
// without rewards of their own report beside their losses (DPO on data,
// DMD2's few-step generator).
//
//   DRAY_ASSIGN_OR_RETURN(std::vector<at::Tensor> edits, ModelEdits(context, rows));
//   DRAY_RETURN_IF_ERROR(ScoreEdits(config, step, context, edits, metrics));
//   metrics["reward_mean"] ...
#ifndef DRAY_WORKERS_TRAIN_EDIT_SCORES_H_
#define DRAY_WORKERS_TRAIN_EDIT_SCORES_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "dispatch/data_proto.h"
#include "workers/train/train_config.h"
#include "workers/train/training_algorithm.h"

namespace dray {

// ModelEdits: the workers' edits of `rows` as the model makes them now,
// decoded (uint8 [H, W, 3]), in row order.
absl::StatusOr<std::vector<at::Tensor>> ModelEdits(const StepContext& context,
                                                   const DataProto& rows);

// ScoreEdits scores `edits` of step `step`'s prompts (one each, in order):
// reward/<function> per function, and the weighted sum's reward_mean and
// reward_std, into `metrics`.
absl::Status ScoreEdits(const TrainConfig& config, int64_t step, const StepContext& context,
                        const std::vector<at::Tensor>& edits, Metrics& metrics);

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_EDIT_SCORES_H_
