#include "workers/train/paired_algorithm.h"

#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/train/training_protocol.h"

namespace dray {

absl::StatusOr<Metrics> PairedAlgorithm::Step(int64_t step, const StepContext& context) {
  Metrics metrics;
  const absl::Time started = absl::Now();
  DRAY_ASSIGN_OR_RETURN(DataProto batch, context.sampler.PairedRows(step));
  batch.SetMeta(kLearningRateKey, context.lr);
  DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> updated, context.workers.PairedUpdate(batch, vae_));
  const std::vector<const char*> keys =
      vae_
          ? std::vector<const char*>{"loss", "reconstruction_rmse", "kl", "latent_std", "grad_norm"}
          : std::vector<const char*>{"loss", "grad_norm"};
  for (const DataProto& rank : updated) {
    for (const char* key : keys) {
      DRAY_ASSIGN_OR_RETURN(double value, rank.GetMeta<double>(key));
      metrics[key] += value / static_cast<double>(updated.size());
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - started);
  metrics["lr"] = context.lr;
  metrics["update_s"] = seconds;
  metrics["images_per_s"] = static_cast<double>(batch.size()) / seconds;
  if (!context.samples_due) return metrics;
  DRAY_ASSIGN_OR_RETURN(DataProto edited, context.workers.Edit(batch, vae_));
  DRAY_ASSIGN_OR_RETURN(const std::vector<Image>* outputs, edited.GetRows<Image>(kEditedColumn));
  std::vector<SampleRow> grid;
  const std::vector<const TrainPrompt*> prompts = context.sampler.PromptsOf(step);
  for (size_t p = 0; p < prompts.size(); ++p) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor output, DecodeImageRow((*outputs)[p]));
    const TrainPrompt& prompt = *prompts[p];
    grid.push_back(vae_ ? SampleRow{prompt.picture_pixels(), {output}, {"reconstruction"}}
                        : SampleRow{prompt.picture_pixels(),
                                    {prompt.target_pixels, output},
                                    {"target", "model"}});
  }
  DRAY_RETURN_IF_ERROR(context.write_samples(grid));
  return metrics;
}

std::vector<ChartSpec> PairedAlgorithm::Charts() const {
  if (vae_)
    return {{"reconstruction RMSE (0-255)", {{"reconstruction_rmse", "rmse", {40, 90, 200}}}}};
  return {{"flow-matching loss", {{"loss", "loss", {40, 90, 200}}}}};
}

}  // namespace dray
