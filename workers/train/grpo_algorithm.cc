#include "workers/train/grpo_algorithm.h"

#include <ATen/ATen.h>

#include <cmath>
#include <future>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "workers/models/image_resize.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/rl/dpo_loss.h"
#include "workers/rl/nft_loss.h"
#include "workers/train/reward_worker.h"
#include "workers/train/training_protocol.h"

namespace dray {
namespace {

double Seconds(absl::Time since) { return absl::ToDoubleSeconds(absl::Now() - since); }

// AddRewardTargets adds the reward workers' column of each sample's target
// image (empty where its row names none), where any row names one.
absl::Status AddRewardTargets(const std::vector<const TrainPrompt*>& prompts, int64_t group_size,
                              DataProto& batch) {
  bool any = false;
  for (const TrainPrompt* prompt : prompts) any = any || !prompt->target.empty();
  if (!any) return absl::OkStatus();
  std::vector<Image> targets;
  for (const TrainPrompt* prompt : prompts) {
    const Image target = prompt->target.empty() ? Image{} : EncodedImageRow(prompt->target);
    targets.insert(targets.end(), group_size, target);
  }
  return batch.AddNonTensor(kRewardTargetsColumn, std::move(targets));
}

// OutputSpread: how far apart the first samples of different prompts are,
// as a share of how far apart their inputs are (RMS over pixels, inputs at
// the outputs' size; pairs with equal inputs left out): 0 when the policy
// gives every input the same picture (collapsed onto its reward), about 1
// for an edit that keeps what tells its inputs apart. NaN with no pair.
absl::StatusOr<double> OutputSpread(const std::vector<RewardInput>& samples, int64_t group_size) {
  std::vector<at::Tensor> outputs, inputs;
  for (size_t i = 0; i < samples.size(); i += group_size) {
    const at::Tensor& output = samples[i].output;
    DRAY_ASSIGN_OR_RETURN(at::Tensor input, ResizeImage(samples[i].input, output.size(0),
                                                        output.size(1), Resample::kBicubic));
    outputs.push_back(output.to(at::kDouble));
    inputs.push_back(input.to(at::kDouble));
  }
  double sum = 0, pairs = 0;
  for (size_t a = 0; a < outputs.size(); ++a) {
    for (size_t b = a + 1; b < outputs.size(); ++b) {
      const double apart = (inputs[a] - inputs[b]).pow(2).mean().sqrt().item<double>();
      if (apart <= 0) continue;
      sum += (outputs[a] - outputs[b]).pow(2).mean().sqrt().item<double>() / apart;
      pairs += 1;
    }
  }
  return pairs > 0 ? sum / pairs : std::nan("");
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpoAlgorithm>> GrpoAlgorithm::Create(const TrainConfig& config) {
  std::unique_ptr<GrpoAlgorithm> grpo(new GrpoAlgorithm(config));
  if (config.async_rollout) grpo->async_ = std::make_unique<AsyncRollouts>(config);
  DRAY_ASSIGN_OR_RETURN(grpo->advantages_, rl::FindAdvantageEstimator(config.adv_estimator));
  if (!config.remote_rewards.empty()) {
    DRAY_ASSIGN_OR_RETURN(grpo->remote_scorers_, RemoteScorers::Connect(config.remote_rewards));
    DRAY_RETURN_IF_ERROR(grpo->remote_scorers_->Score({}).get().status());  // each one answers
  }
  return grpo;
}

std::vector<ChartSpec> GrpoAlgorithm::Charts() const {
  // The second series: how far the policy has moved (DiffusionNFT: from
  // the reference, as its velocities' distance).
  const CurveSpec moved = config_.nft() ? CurveSpec{"kl_div", "kl_div", {60, 160, 60}}
                                        : CurveSpec{"approx_kl", "approx_kl", {60, 160, 60}};
  return {{"reward", {{"reward_mean", "mean", {200, 50, 40}}}},
          {"loss", {{"policy_loss", "policy", {40, 90, 200}}, moved}}};
}

absl::StatusOr<Metrics> GrpoAlgorithm::Step(int64_t step, const StepContext& context) {
  Metrics metrics;
  const absl::Time started = absl::Now();
  DRAY_ASSIGN_OR_RETURN(DataProto rows, context.sampler.RolloutRows(step));
  DataProto rollout;
  if (async_ != nullptr) {  // sampled meanwhile by the rollout group; the next starts now
    DRAY_ASSIGN_OR_RETURN(rollout, async_->Take(step, rows, context, metrics));
    if (step + 1 < config_.total_steps)
      DRAY_RETURN_IF_ERROR(async_->Ahead(step + 1, context, metrics));
  } else {
    DRAY_ASSIGN_OR_RETURN(rollout, context.workers.Rollout(rows, context.on_rollout_progress));
    metrics["staleness"] = 0;
  }
  metrics["rollout_s"] = Seconds(started);

  const absl::Time rewarding = absl::Now();
  DRAY_ASSIGN_OR_RETURN(Scores scores, Rewards(step, context, rollout, rows, metrics));
  const std::vector<double>& rewards = scores.total;
  std::vector<std::string> groups;
  for (const TrainPrompt* prompt : context.sampler.PromptsOf(step))
    groups.insert(groups.end(), config_.group_size, prompt->group());
  const at::Tensor reward_tensor = at::tensor(rewards, at::kDouble);
  rl::AdvantageOptions advantage_options;
  advantage_options.global_std = config_.global_std;
  advantage_options.trimmed_ratio = config_.trimmed_ratio;
  at::Tensor advantages;
  if (config_.multi_reward_mix == "advantage_aggr") {  // MixGRPO's: each reward's, weighted
    DRAY_ASSIGN_OR_RETURN(advantages, rl::MixedAdvantages(advantages_, groups, scores.by_reward,
                                                          scores.weights, advantage_options));
  } else {
    DRAY_ASSIGN_OR_RETURN(advantages, advantages_(groups, reward_tensor, advantage_options));
  }
  metrics["reward_mean"] = reward_tensor.mean().item<double>();
  metrics["reward_std"] = reward_tensor.std(/*unbiased=*/false).item<double>();
  metrics["advantage_abs_mean"] = advantages.abs().mean().item<double>();
  int64_t tied = 0;
  for (int64_t g = 0; g < config_.prompts_per_step; ++g) {
    const at::Tensor group = reward_tensor.narrow(0, g * config_.group_size, config_.group_size);
    tied += (group == group[0]).all().item<bool>() ? 1 : 0;
  }
  metrics["zero_std_ratio"] = static_cast<double>(tied) / config_.prompts_per_step;
  metrics["reward_s"] = Seconds(rewarding);
  metrics["lr"] = context.lr;
  // Done: the step's throughput, and its samples when due.
  auto done = [&]() -> absl::StatusOr<Metrics> {
    metrics["images_per_s"] = static_cast<double>(rows.size()) / Seconds(started);
    return WithSamples(step, context, rollout, rewards, std::move(metrics));
  };
  if (config_.dpo()) {
    DRAY_RETURN_IF_ERROR(PreferenceUpdate(step, context, rows, rollout, rewards, metrics));
    return done();
  }
  if (config_.nft()) {
    DRAY_RETURN_IF_ERROR(NftUpdate(step, context, advantages, metrics));
    return done();
  }

  // The trained window steps: a seeded timestep_fraction of them.
  DRAY_ASSIGN_OR_RETURN(int64_t window_begin, rows.GetMeta<int64_t>(kSdeWindowBeginKey));
  DRAY_ASSIGN_OR_RETURN(int64_t window_end, rows.GetMeta<int64_t>(kSdeWindowEndKey));
  const std::vector<int64_t> train_steps =
      context.sampler.TrainedSteps(step, window_end - window_begin);
  metrics["trained_steps"] = static_cast<double>(train_steps.size());
  if (train_steps.empty()) return done();  // MixGRPO's empty window at the end: nothing to train

  DRAY_ASSIGN_OR_RETURN(DataProto batch, UpdateBatch(context, advantages));
  if (config_.name == "dance_grpo") {  // a subset of its own per sample
    DRAY_RETURN_IF_ERROR(batch.AddTensor(
        kRowTrainStepsColumn,
        context.sampler.RowTrainedSteps(step, rows.size(), window_end - window_begin)));
  }
  batch.SetMeta(kTrainStepsKey, Json{nlohmann::json(train_steps).dump()});
  DRAY_RETURN_IF_ERROR(InnerEpochs(step, context, batch, nullptr, metrics));
  return done();
}

absl::StatusOr<DataProto> GrpoAlgorithm::UpdateBatch(const StepContext& context,
                                                     const at::Tensor& advantages) const {
  // The trajectories stay where they were sampled: the update names each
  // row by its place in its rank's share, with its advantage.
  const int64_t rows = advantages.size(0);
  const int64_t share = rows / context.workers.world_size();
  DRAY_ASSIGN_OR_RETURN(
      DataProto batch,
      DataProto::Make({{kRolloutRowColumn, at::arange(rows, at::kLong).remainder(share)},
                       {kAdvantagesColumn, advantages}}));
  batch.SetMeta(kLearningRateKey, context.lr);
  return batch;
}

absl::Status GrpoAlgorithm::InnerEpochs(
    int64_t step, const StepContext& context, const DataProto& batch,
    const std::function<absl::Status(int64_t epoch, DataProto& batch)>& for_epoch,
    Metrics& metrics) const {
  const absl::Time updating = absl::Now();
  // Each key over the ranks and epochs that report it: averaged, or for a
  // maximum ("..._max") the largest.
  std::map<std::string, std::pair<double, double>> reported;  // key -> (sum or max, count)
  for (int64_t epoch = 0; epoch < config_.num_inner_epochs; ++epoch) {
    DataProto epoch_batch = batch;
    if (for_epoch) DRAY_RETURN_IF_ERROR(for_epoch(epoch, epoch_batch));
    // In the rollout's order, then shuffled within each rank's share, as
    // flow_grpo shuffles within each process: a row stays where it was
    // sampled, whose encodings it reuses (PromptSampler::UpdateOrder).
    DRAY_ASSIGN_OR_RETURN(DataProto shuffled,
                          epoch_batch.Reorder(context.sampler.UpdateOrder(
                              step, epoch, epoch_batch.size(), context.workers.world_size())));
    absl::StatusOr<std::vector<DataProto>> updated = context.workers.UpdateActor(shuffled);
    if (updated.status().code() == absl::StatusCode::kDataLoss && config_.on_nan == "skip") {
      Log("train", absl::StrCat("skipping step ", step, ": ", updated.status().message()));
      metrics["skipped"] = 1;
      break;
    }
    DRAY_RETURN_IF_ERROR(updated.status());
    for (const DataProto& rank : *updated) {
      for (const auto& [key, value] : rank.meta_info()) {
        const double* number = std::get_if<double>(&value);
        if (number == nullptr) continue;
        auto& [combined, count] = reported[key];
        if (!absl::EndsWith(key, "_max")) {
          combined += *number;
        } else {
          combined = count == 0 ? *number : std::max(combined, *number);
        }
        count += 1;
      }
    }
  }
  for (const auto& [key, entry] : reported)
    metrics[key] = absl::EndsWith(key, "_max") ? entry.first : entry.first / entry.second;
  metrics["update_s"] = Seconds(updating);
  return absl::OkStatus();
}

absl::Status GrpoAlgorithm::NftUpdate(int64_t step, const StepContext& context,
                                      const at::Tensor& advantages, Metrics& metrics) const {
  DRAY_ASSIGN_OR_RETURN(const DataProto batch, UpdateBatch(context, advantages));
  // The sampling policy's decay after the step's optimizer steps, counted
  // from the start as DiffusionNFT's global_step counts them.
  DRAY_ASSIGN_OR_RETURN(const double decay,
                        rl::NftOldPolicyDecay((step + 1) * config_.num_inner_epochs,
                                              static_cast<int>(config_.decay_type)));
  const int64_t steps = config_.num_inference_steps;
  auto for_epoch = [&](int64_t epoch, DataProto& epoch_batch) -> absl::Status {
    // Each row's own shuffle of the schedule's timesteps, drawn afresh.
    const at::Tensor row_steps =
        context.sampler.RowTrainedSteps(step, epoch_batch.size(), steps, epoch);
    metrics["trained_steps"] = static_cast<double>(row_steps.size(1));
    epoch_batch.SetMeta(kInnerEpochKey, epoch);
    if (epoch + 1 == config_.num_inner_epochs) epoch_batch.SetMeta(kSamplingPolicyDecayKey, decay);
    return epoch_batch.AddTensor(kRowTrainStepsColumn, row_steps);
  };
  DRAY_RETURN_IF_ERROR(InnerEpochs(step, context, batch, for_epoch, metrics));
  if (metrics.count("skipped") == 0) metrics["sampling_policy_decay"] = decay;
  return absl::OkStatus();
}

absl::Status GrpoAlgorithm::PreferenceUpdate(int64_t step, const StepContext& context,
                                             const DataProto& rows, const DataProto& rollout,
                                             const std::vector<double>& rewards,
                                             Metrics& metrics) const {
  const absl::Time updating = absl::Now();
  // One pair per prompt of the step (a prompt drawn twice pairs twice).
  std::vector<std::string> prompt_of_row;
  for (size_t i = 0; i < rewards.size(); ++i)
    prompt_of_row.push_back(std::to_string(i / config_.group_size));
  DRAY_ASSIGN_OR_RETURN(std::vector<rl::DpoPair> pairs, rl::DpoPairs(prompt_of_row, rewards));
  DRAY_ASSIGN_OR_RETURN(const std::vector<Image>* outputs, rollout.GetRows<Image>(kEditedColumn));
  std::vector<int64_t> prompt_rows;
  std::vector<Image> chosen, rejected;
  double gap = 0;
  for (const rl::DpoPair& pair : pairs) {
    prompt_rows.push_back(pair.chosen);
    chosen.push_back((*outputs)[pair.chosen]);
    rejected.push_back((*outputs)[pair.rejected]);
    gap += (rewards[pair.chosen] - rewards[pair.rejected]) / static_cast<double>(pairs.size());
  }
  DRAY_ASSIGN_OR_RETURN(DataProto batch, rows.SelectRows(prompt_rows));  // each prompt's inputs
  DRAY_RETURN_IF_ERROR(batch.AddNonTensor(kTargetsColumn, std::move(chosen)));
  DRAY_RETURN_IF_ERROR(batch.AddNonTensor(kRejectedColumn, std::move(rejected)));
  DRAY_RETURN_IF_ERROR(
      batch.AddTensor(kSigmaDrawsColumn, context.sampler.DpoDraws(step, batch.size())));
  batch.SetMeta(kLearningRateKey, context.lr);
  DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> updated,
                        context.workers.PairedUpdate(batch, PairedKind::kDpo));
  for (const DataProto& rank : updated) {
    for (const char* key : {"loss", "implicit_acc", "dpo_margin", "grad_norm"}) {
      DRAY_ASSIGN_OR_RETURN(double value, rank.GetMeta<double>(key));
      metrics[key] += value / static_cast<double>(updated.size());
    }
  }
  metrics["dpo_reward_gap"] = gap;
  metrics["update_s"] = Seconds(updating);
  return absl::OkStatus();
}

absl::StatusOr<Metrics> GrpoAlgorithm::WithSamples(int64_t step, const StepContext& context,
                                                   const DataProto& rollout,
                                                   const std::vector<double>& rewards,
                                                   Metrics metrics) const {
  if (context.samples_due) {
    DRAY_ASSIGN_OR_RETURN(std::vector<SampleRow> grid, Samples(step, context, rollout, rewards));
    DRAY_RETURN_IF_ERROR(context.write_samples(grid));
  }
  return metrics;
}

absl::StatusOr<GrpoAlgorithm::Scores> GrpoAlgorithm::Rewards(int64_t step,
                                                             const StepContext& context,
                                                             const DataProto& rollout,
                                                             const DataProto& rows,
                                                             Metrics& metrics) const {
  DRAY_ASSIGN_OR_RETURN(const std::vector<Image>* outputs, rollout.GetRows<Image>(kEditedColumn));
  DRAY_ASSIGN_OR_RETURN(const std::vector<std::string>* instructions,
                        rows.GetRows<std::string>(kInstructionsColumn));
  const std::vector<const TrainPrompt*> prompts = context.sampler.PromptsOf(step);
  std::vector<RewardInput> samples;
  for (size_t i = 0; i < outputs->size(); ++i) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor pixels, DecodeImageRow((*outputs)[i]));
    const TrainPrompt& prompt = *prompts[i / config_.group_size];
    samples.push_back({std::move(pixels), prompt.pixels, (*instructions)[i], prompt.fields,
                       prompt.target_pixels});
  }
  DRAY_ASSIGN_OR_RETURN(metrics["output_spread"], OutputSpread(samples, config_.group_size));
  // The remote scorers work while the built-in functions run here.
  std::future<absl::StatusOr<std::vector<RemoteScores>>> remote;
  if (remote_scorers_ != nullptr) remote = remote_scorers_->Score(samples);
  const double n = static_cast<double>(samples.size());
  Scores out{std::vector<double>(samples.size(), 0.0), at::Tensor(), config_.reward_weights};
  DRAY_ASSIGN_OR_RETURN(at::Tensor scores, FunctionScores(step, context, samples, rollout, rows));
  std::vector<at::Tensor> columns;
  for (size_t f = 0; f < config_.reward_functions.size(); ++f) {
    const at::Tensor column = scores.select(1, static_cast<int64_t>(f));
    for (size_t i = 0; i < samples.size(); ++i)
      out.total[i] += config_.reward_weights[f] * column[i].item<double>();
    metrics["reward/" + config_.reward_functions[f]] = column.mean().item<double>();
    columns.push_back(column.to(at::kDouble));
  }
  auto finished = [&] {
    out.by_reward = at::stack(columns, 1);
    return out;
  };
  if (!remote.valid()) return finished();
  DRAY_ASSIGN_OR_RETURN(std::vector<RemoteScores> scored, remote.get());
  for (size_t r = 0; r < scored.size(); ++r) {
    const RemoteRewardConfig& scorer = config_.remote_rewards[r];
    double sum = 0;
    for (size_t i = 0; i < samples.size(); ++i) {
      out.total[i] += scorer.weight * scored[r].scores[i];
      sum += scored[r].scores[i];
    }
    columns.push_back(at::tensor(scored[r].scores, at::kDouble));
    out.weights.push_back(scorer.weight);
    metrics["reward/" + scorer.name] = sum / n;
    for (const auto& [part, values] : scored[r].components) {
      double part_sum = 0, scored_rows = 0;  // over the rows the part was given for
      for (double value : values) {
        if (!std::isfinite(value)) continue;
        part_sum += value;
        scored_rows += 1;
      }
      metrics[absl::StrCat("reward/", scorer.name, "/", part)] = part_sum / scored_rows;
    }
  }
  return finished();
}

absl::StatusOr<at::Tensor> GrpoAlgorithm::FunctionScores(int64_t step, const StepContext& context,
                                                         const std::vector<RewardInput>& samples,
                                                         const DataProto& rollout,
                                                         const DataProto& rows) const {
  const std::vector<std::string>& names = config_.reward_functions;
  if (config_.reward_placement != "controller") {
    DRAY_ASSIGN_OR_RETURN(DataProto batch,
                          rows.Select({{},
                                       std::vector<std::string>{kImagesColumn, kInstructionsColumn},
                                       std::vector<std::string>{}}));
    DRAY_ASSIGN_OR_RETURN(DataProto edited, rollout.Select({std::vector<std::string>{},
                                                            std::vector<std::string>{kEditedColumn},
                                                            std::vector<std::string>{}}));
    DRAY_ASSIGN_OR_RETURN(batch, batch.Union(edited));
    std::vector<Json> fields;
    for (const RewardInput& sample : samples) fields.push_back({sample.fields.dump()});
    DRAY_RETURN_IF_ERROR(batch.AddNonTensor(kRewardFieldsColumn, std::move(fields)));
    DRAY_RETURN_IF_ERROR(
        AddRewardTargets(context.sampler.PromptsOf(step), config_.group_size, batch));
    batch.SetMeta("functions", Json{nlohmann::json(names).dump()});
    return context.workers.ComputeReward(batch);
  }
  const std::vector<const TrainPrompt*> prompts = context.sampler.PromptsOf(step);
  return ScoreSamples(names, samples, [&](size_t i) {
    return absl::StrCat("sample ", i, " (", prompts[i / config_.group_size]->image_path, ")");
  });
}

absl::StatusOr<std::vector<SampleRow>> GrpoAlgorithm::Samples(
    int64_t step, const StepContext& context, const DataProto& rollout,
    const std::vector<double>& rewards) const {
  DRAY_ASSIGN_OR_RETURN(const std::vector<Image>* outputs, rollout.GetRows<Image>(kEditedColumn));
  std::vector<SampleRow> grid;
  const std::vector<const TrainPrompt*> prompts = context.sampler.PromptsOf(step);
  for (size_t p = 0; p < prompts.size(); ++p) {
    SampleRow row{prompts[p]->picture_pixels(), {}, {}};
    for (int64_t g = 0; g < config_.group_size; ++g) {
      const size_t i = p * config_.group_size + g;
      DRAY_ASSIGN_OR_RETURN(at::Tensor output, DecodeImageRow((*outputs)[i]));
      row.outputs.push_back(output);
      row.captions.push_back(absl::StrFormat("%.3f", rewards[i]));
    }
    grid.push_back(std::move(row));
  }
  return grid;
}

}  // namespace dray
