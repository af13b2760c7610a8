#include "workers/train/dmd2_algorithm.h"

#include <ATen/ATen.h>

#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "workers/train/edit_scores.h"
#include "workers/train/training_protocol.h"

namespace dray {

absl::StatusOr<Metrics> Dmd2Algorithm::Step(int64_t step, const StepContext& context) {
  Metrics metrics;
  const absl::Time started = absl::Now();
  DRAY_ASSIGN_OR_RETURN(DataProto batch, context.sampler.Dmd2Rows(step));
  const double warm_up = context.lr / config_.lr;
  batch.SetMeta(kLearningRateKey, context.lr);
  batch.SetMeta(kGuidanceLearningRateKey, config_.guidance_lr * warm_up);
  DRAY_ASSIGN_OR_RETURN(bool generator_learns, batch.GetMeta<bool>(kUpdateGeneratorKey));
  DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> updated,
                        context.workers.Dmd2Update(batch, context.on_rollout_progress));
  std::vector<const char*> keys = {"loss_fake_mean", "fake_grad_norm"};
  if (generator_learns) keys.insert(keys.end(), {"loss_dm", "grad_norm"});
  if (config_.cls_on_clean_image) {
    keys.insert(keys.end(), {"guidance_cls_loss", "pred_realism_on_real", "pred_realism_on_fake"});
    if (generator_learns && config_.gen_cls_loss) keys.push_back("gen_cls_loss");
  }
  for (const DataProto& rank : updated) {
    for (const char* key : keys) {
      DRAY_ASSIGN_OR_RETURN(double value, rank.GetMeta<double>(key));
      metrics[key] += value / static_cast<double>(updated.size());
    }
  }
  metrics["lr"] = context.lr;
  metrics["guidance_lr"] = config_.guidance_lr * warm_up;
  metrics["update_s"] = absl::ToDoubleSeconds(absl::Now() - started);
  metrics["images_per_s"] =
      static_cast<double>(batch.size()) / absl::ToDoubleSeconds(absl::Now() - started);
  if (context.samples_due) DRAY_RETURN_IF_ERROR(WriteSamples(step, context, batch, metrics));
  return metrics;
}

absl::Status Dmd2Algorithm::WriteSamples(int64_t step, const StepContext& context,
                                         const DataProto& rows, Metrics& metrics) const {
  DRAY_ASSIGN_OR_RETURN(std::vector<at::Tensor> edits, ModelEdits(context, rows));
  if (!config_.reward_functions.empty())
    DRAY_RETURN_IF_ERROR(ScoreEdits(config_, step, context, edits, metrics));
  std::vector<SampleRow> grid;
  const std::vector<const TrainPrompt*> prompts = context.sampler.PromptsOf(step);
  for (size_t p = 0; p < prompts.size(); ++p) {
    const at::Tensor& output = edits.at(p);
    const TrainPrompt& prompt = *prompts[p];
    if (prompt.target_pixels.defined()) {
      grid.push_back(
          {prompt.picture_pixels(), {prompt.target_pixels, output}, {"target", "generator"}});
    } else {
      grid.push_back({prompt.picture_pixels(), {output}, {"generator"}});
    }
  }
  return context.write_samples(grid);
}

std::vector<ChartSpec> Dmd2Algorithm::Charts() const {
  // (The charts' font has lower-case letters, digits and few signs.)
  return {{"reward of the generator edits", {{"reward_mean", "mean", {200, 50, 40}}}},
          {"losses",
           {{"loss_fake_mean", "fake score", {40, 90, 200}},
            {"loss_dm", "distribution matching", {60, 160, 60}}}}};
}

}  // namespace dray
