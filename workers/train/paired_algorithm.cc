#include "workers/train/paired_algorithm.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/train/edit_scores.h"
#include "workers/train/training_protocol.h"

namespace dray {

PairedAlgorithm::PairedAlgorithm(const TrainConfig& config)
    : config_(config),
      kind_(config.vae()   ? PairedKind::kVae
            : config.dpo() ? PairedKind::kDpo
                           : PairedKind::kSft) {}

absl::StatusOr<Metrics> PairedAlgorithm::Step(int64_t step, const StepContext& context) {
  Metrics metrics;
  const absl::Time started = absl::Now();
  DRAY_ASSIGN_OR_RETURN(DataProto batch, context.sampler.PairedRows(step));
  if (kind_ == PairedKind::kDpo && !config_.reward_functions.empty()) {
    DRAY_ASSIGN_OR_RETURN(std::vector<at::Tensor> edits, ModelEdits(context, batch));
    DRAY_RETURN_IF_ERROR(ScoreEdits(config_, step, context, edits, metrics));
  }
  const absl::Time updating = absl::Now();
  batch.SetMeta(kLearningRateKey, context.lr);
  DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> updated, context.workers.PairedUpdate(batch, kind_));
  const std::vector<const char*> keys =
      kind_ == PairedKind::kVae
          ? std::vector<const char*>{"loss", "reconstruction_rmse", "kl", "latent_std", "grad_norm"}
      : kind_ == PairedKind::kDpo
          ? std::vector<const char*>{"loss", "implicit_acc", "dpo_margin", "grad_norm"}
          : std::vector<const char*>{"loss", "grad_norm"};
  for (const DataProto& rank : updated) {
    for (const char* key : keys) {
      DRAY_ASSIGN_OR_RETURN(double value, rank.GetMeta<double>(key));
      metrics[key] += value / static_cast<double>(updated.size());
    }
  }
  metrics["lr"] = context.lr;
  metrics["update_s"] = absl::ToDoubleSeconds(absl::Now() - updating);
  metrics["images_per_s"] =
      static_cast<double>(batch.size()) / absl::ToDoubleSeconds(absl::Now() - started);
  if (!context.samples_due) return metrics;
  const bool vae = kind_ == PairedKind::kVae;
  DRAY_ASSIGN_OR_RETURN(DataProto edited, context.workers.Edit(batch, vae));
  DRAY_ASSIGN_OR_RETURN(const std::vector<Image>* outputs, edited.GetRows<Image>(kEditedColumn));
  std::vector<SampleRow> grid;
  const std::vector<const TrainPrompt*> prompts = context.sampler.PromptsOf(step);
  for (size_t p = 0; p < prompts.size(); ++p) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor output, DecodeImageRow((*outputs)[p]));
    const TrainPrompt& prompt = *prompts[p];
    if (vae) {
      grid.push_back({prompt.picture_pixels(), {output}, {"reconstruction"}});
    } else if (kind_ == PairedKind::kDpo) {
      grid.push_back({prompt.picture_pixels(),
                      {prompt.target_pixels, prompt.rejected_pixels, output},
                      {"chosen", "rejected", "model"}});
    } else {
      grid.push_back(
          {prompt.picture_pixels(), {prompt.target_pixels, output}, {"target", "model"}});
    }
  }
  DRAY_RETURN_IF_ERROR(context.write_samples(grid));
  return metrics;
}

std::vector<ChartSpec> PairedAlgorithm::Charts() const {
  if (kind_ == PairedKind::kVae)
    return {{"reconstruction RMSE (0-255)", {{"reconstruction_rmse", "rmse", {40, 90, 200}}}}};
  if (kind_ == PairedKind::kDpo)
    return {{"reward of the edits", {{"reward_mean", "mean", {200, 50, 40}}}},
            {"DPO",
             {{"loss", "loss", {40, 90, 200}}, {"implicit_acc", "implicit acc", {60, 160, 60}}}}};
  return {{"flow-matching loss", {{"loss", "loss", {40, 90, 200}}}}};
}

}  // namespace dray
