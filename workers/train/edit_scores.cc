#include "workers/train/edit_scores.h"

#include <ATen/ATen.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/train/rewards.h"

namespace dray {

absl::StatusOr<std::vector<at::Tensor>> ModelEdits(const StepContext& context,
                                                   const DataProto& rows) {
  DRAY_ASSIGN_OR_RETURN(DataProto edited, context.workers.Edit(rows, /*vae=*/false));
  DRAY_ASSIGN_OR_RETURN(const std::vector<Image>* outputs, edited.GetRows<Image>(kEditedColumn));
  std::vector<at::Tensor> edits;
  for (const Image& output : *outputs) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor pixels, DecodeImageRow(output));
    edits.push_back(std::move(pixels));
  }
  return edits;
}

absl::Status ScoreEdits(const TrainConfig& config, int64_t step, const StepContext& context,
                        const std::vector<at::Tensor>& edits, Metrics& metrics) {
  const std::vector<const TrainPrompt*> prompts = context.sampler.PromptsOf(step);
  std::vector<RewardInput> samples;
  for (size_t p = 0; p < prompts.size(); ++p) {
    samples.push_back({edits.at(p), prompts[p]->pixels, prompts[p]->instruction, prompts[p]->fields,
                       prompts[p]->target_pixels});
  }
  DRAY_ASSIGN_OR_RETURN(at::Tensor scores,
                        ScoreSamples(config.reward_functions, samples, [&](size_t i) {
                          return absl::StrCat("edit ", i, " (", prompts[i]->image_path, ")");
                        }));
  at::Tensor total = at::zeros({scores.size(0)}, at::kDouble);
  for (size_t f = 0; f < config.reward_functions.size(); ++f) {
    const at::Tensor column = scores.select(1, static_cast<int64_t>(f));
    total += config.reward_weights[f] * column;
    metrics["reward/" + config.reward_functions[f]] = column.mean().item<double>();
  }
  metrics["reward_mean"] = total.mean().item<double>();
  metrics["reward_std"] = total.std(/*unbiased=*/false).item<double>();
  return absl::OkStatus();
}

}  // namespace dray
