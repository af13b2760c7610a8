#include "workers/train/prompt_sampler.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/train/training_protocol.h"

namespace dray {

uint64_t StreamSeed(uint64_t seed, SeedStream stream, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ULL +
               static_cast<uint64_t>(stream) * 0xBF58476D1CE4E5B9ULL +
               index * 0x94D049BB133111EBULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

PromptSampler::PromptSampler(const TrainConfig& config, std::vector<TrainPrompt> prompts)
    : config_(config), prompts_(std::move(prompts)) {
  // A bucket: prompts whose pictures have the same sizes (one denoising loop).
  std::map<std::vector<std::pair<int64_t, int64_t>>, size_t> bucket_of_size;
  for (size_t i = 0; i < prompts_.size(); ++i) {
    std::vector<std::pair<int64_t, int64_t>> sizes = {
        {prompts_[i].pixels.size(0), prompts_[i].pixels.size(1)}};
    for (const at::Tensor& pixels : prompts_[i].more_pixels)
      sizes.push_back({pixels.size(0), pixels.size(1)});
    const auto [it, added] = bucket_of_size.emplace(sizes, buckets_.size());
    if (added) buckets_.emplace_back();
    buckets_[it->second].push_back(i);
    bucket_of_.push_back(it->second);
  }
}

uint64_t PromptSampler::Seed(SeedStream stream, uint64_t index) const {
  return StreamSeed(config_.seed, stream, index);
}

std::vector<const TrainPrompt*> PromptSampler::PromptsOf(int64_t step) const {
  std::vector<size_t> chosen;
  const int64_t count = static_cast<int64_t>(prompts_.size());
  for (int64_t k = step * config_.prompts_per_step; k < (step + 1) * config_.prompts_per_step;
       ++k) {
    std::vector<size_t> order(prompts_.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(),
                 std::mt19937_64(Seed(SeedStream::kPromptOrder, k / count)));
    chosen.push_back(order[k % count]);
  }
  if (buckets_.size() > 1) {
    std::vector<size_t> bucket = buckets_[bucket_of_[chosen.front()]];
    std::shuffle(bucket.begin(), bucket.end(),
                 std::mt19937_64(Seed(SeedStream::kSameSizePrompts, step)));
    for (size_t i = 1; i < chosen.size(); ++i) chosen[i] = bucket[(i - 1) % bucket.size()];
  }
  std::vector<const TrainPrompt*> prompts;
  for (size_t i : chosen) prompts.push_back(&prompts_[i]);
  return prompts;
}

absl::StatusOr<DataProto> PromptSampler::EditRows(int64_t step, int64_t copies,
                                                  bool shared_initial_noise) const {
  std::vector<std::vector<Bytes>> images;
  std::vector<std::string> instructions;
  std::vector<int64_t> seeds;
  for (const TrainPrompt* prompt : PromptsOf(step)) {
    for (int64_t g = 0; g < copies; ++g) {
      images.push_back(prompt->pictures());
      instructions.push_back(prompt->instruction);
      seeds.push_back(
          static_cast<int64_t>(Seed(SeedStream::kSampleSeed, step * 1000003 + seeds.size()) >> 2));
    }
  }
  if (!shared_initial_noise) return MakeEditBatch(images, instructions, seeds);
  // Each copy starts from its prompt's first row's noise; its SDE noise is
  // still its own.
  std::vector<int64_t> shared(seeds.size());
  for (size_t i = 0; i < seeds.size(); ++i) shared[i] = seeds[i - i % static_cast<size_t>(copies)];
  DRAY_ASSIGN_OR_RETURN(DataProto batch, MakeEditBatch(images, instructions, shared));
  DRAY_RETURN_IF_ERROR(batch.AddNonTensor(kSdeSeedsColumn, std::move(seeds)));
  return batch;
}

absl::StatusOr<DataProto> PromptSampler::RolloutRows(int64_t step) const {
  DRAY_ASSIGN_OR_RETURN(DataProto batch,
                        EditRows(step, config_.group_size,
                                 (config_.name == "dance_grpo" || config_.name == "mix_grpo") &&
                                     config_.init_same_noise));
  const auto [begin, end] = SdeWindowOf(step);
  batch.SetMeta(kSdeWindowBeginKey, begin);
  batch.SetMeta(kSdeWindowEndKey, end);
  AskForRefresh(step, batch);
  return batch;
}

absl::StatusOr<DataProto> PromptSampler::Dmd2Rows(int64_t step) const {
  DRAY_ASSIGN_OR_RETURN(DataProto batch, EditRows(step, 1));
  const int64_t simulated =
      config_.backward_simulation
          ? static_cast<int64_t>(Seed(SeedStream::kSimulatedSteps, step) %
                                 static_cast<uint64_t>(config_.num_denoising_step))
          : 0;
  batch.SetMeta(kSimulatedStepsKey, simulated);
  batch.SetMeta(kUpdateGeneratorKey, step % config_.dfake_gen_update_ratio == 0);
  if (!config_.cls_on_clean_image) return batch;
  std::vector<Image> targets;  // the GAN's real images
  for (const TrainPrompt* prompt : PromptsOf(step)) {
    if (prompt->target.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(prompt->image_path,
                       ": algorithm.cls_on_clean_image needs a \"target\" in every row "
                       "(DMD2's GAN tells them, the real images, from the generator's)"));
    }
    targets.push_back(EncodedImageRow(prompt->target));
  }
  DRAY_RETURN_IF_ERROR(batch.AddNonTensor(kTargetsColumn, std::move(targets)));
  return batch;
}

void PromptSampler::AskForRefresh(int64_t step, DataProto& batch) const {
  const int64_t every = config_.ref_update_step;
  if (config_.dpo() && every > 0 && step > 0 && step % every == 0)
    batch.SetMeta(kRefreshSamplingPolicyKey, true);
}

std::pair<int64_t, int64_t> PromptSampler::SdeWindowOf(int64_t step) const {
  const int64_t steps = config_.num_inference_steps;
  const rl::MixGrpoWindowOptions mix = config_.MixWindow();
  if (config_.name == "mix_grpo" && mix.strategy != "random") {
    const rl::MixGrpoWindow window = rl::MixGrpoWindowAt(mix, step);
    return {window.begin, window.end};
  }
  if (config_.name == "dance_grpo") return {0, steps};      // every step (the last untrained)
  if (config_.nft()) return {0, 0};                         // deterministic: no SDE step
  if (config_.sde_window_size == 0) return {0, steps - 1};  // every step but the last
  // A seeded window of the given size within its range (mix_grpo's random
  // strategy: within MixGRPO's trainable steps).
  const int64_t lo = config_.name == "mix_grpo" ? 0 : config_.sde_window_range[0];
  const int64_t hi = config_.name == "mix_grpo"        ? mix.max_timesteps
                     : config_.sde_window_range[1] > 0 ? config_.sde_window_range[1]
                                                       : steps - 1;
  const int64_t starts = std::max<int64_t>(1, hi - config_.sde_window_size - lo + 1);
  const int64_t begin = lo + static_cast<int64_t>(Seed(SeedStream::kSdeWindow, step) % starts);
  return {begin, begin + config_.sde_window_size};
}

absl::StatusOr<DataProto> PromptSampler::PairedRows(int64_t step) const {
  DRAY_ASSIGN_OR_RETURN(DataProto batch, EditRows(step, 1));
  std::vector<Image> targets, rejected;
  for (const TrainPrompt* prompt : PromptsOf(step)) {
    targets.push_back(EncodedImageRow(prompt->target));
    if (config_.dpo()) rejected.push_back(EncodedImageRow(prompt->rejected));
  }
  DRAY_RETURN_IF_ERROR(batch.AddNonTensor(kTargetsColumn, std::move(targets)));
  if (config_.dpo()) {
    DRAY_RETURN_IF_ERROR(batch.AddNonTensor(kRejectedColumn, std::move(rejected)));
    DRAY_RETURN_IF_ERROR(batch.AddTensor(kSigmaDrawsColumn, DpoDraws(step, batch.size())));
  } else {
    DRAY_RETURN_IF_ERROR(batch.AddTensor(kSigmaDrawsColumn, UniformDraws(step, batch.size())));
  }
  AskForRefresh(step, batch);
  return batch;
}

at::Tensor PromptSampler::UniformDraws(int64_t step, int64_t count) const {
  std::vector<double> draws(count);
  for (int64_t k = 0; k < count; ++k) {
    draws[k] = static_cast<double>(Seed(SeedStream::kSigmaDraw, step * 1000003 + k) >> 11) /
               static_cast<double>(uint64_t{1} << 53);  // uniform in [0, 1)
  }
  return at::tensor(draws, at::kDouble);
}

at::Tensor PromptSampler::DpoDraws(int64_t step, int64_t rows) const {
  // flow_grpo's logit-normal timesteps: u = sigmoid(n), n ~ N(0, 1)
  // (diffusers' compute_density_for_timestep_sampling), n from a uniform
  // draw by the normal's inverse CDF.
  const at::Tensor uniform = UniformDraws(step, rows * config_.dpo_draws());
  return at::sigmoid(std::sqrt(2.0) * at::erfinv(2 * uniform - 1)).view({rows, -1});
}

std::vector<int64_t> PromptSampler::SeededSubset(uint64_t seed, int64_t window) const {
  // DanceGRPO never trains its last step and takes int((S - 1) fraction);
  // DiffusionNFT takes int(S fraction).
  const bool dance = config_.name == "dance_grpo";
  const int64_t candidates = dance ? window - 1 : window;
  if (candidates <= 0) return {};
  std::vector<int64_t> steps(candidates);
  std::iota(steps.begin(), steps.end(), 0);
  std::shuffle(steps.begin(), steps.end(), std::mt19937_64(seed));
  const double share = config_.timestep_fraction * static_cast<double>(candidates);
  steps.resize(std::max<int64_t>(1, dance || config_.nft()
                                        ? static_cast<int64_t>(share)
                                        : static_cast<int64_t>(std::llround(share))));
  return steps;
}

std::vector<int64_t> PromptSampler::TrainedSteps(int64_t step, int64_t window) const {
  std::vector<int64_t> steps = SeededSubset(Seed(SeedStream::kTrainedSteps, step), window);
  std::sort(steps.begin(), steps.end());
  return steps;
}

at::Tensor PromptSampler::RowTrainedSteps(int64_t step, int64_t rows, int64_t window,
                                          int64_t epoch) const {
  std::vector<at::Tensor> subsets;
  for (int64_t row = 0; row < rows; ++row) {
    const uint64_t index = (static_cast<uint64_t>(epoch) << 40) + step * 1000003 + row;
    subsets.push_back(
        at::tensor(SeededSubset(Seed(SeedStream::kRowTrainedSteps, index), window), at::kLong));
  }
  return at::stack(subsets);
}

std::vector<int64_t> PromptSampler::UpdateOrder(int64_t step, int64_t epoch, int64_t rows,
                                                int ranks) const {
  std::vector<int64_t> order(rows);
  std::iota(order.begin(), order.end(), 0);
  if (epoch == 0) return order;  // the rollout's micro-batches: its log-probs bit for bit
  std::mt19937_64 random(Seed(SeedStream::kUpdateOrder, step * 1000 + epoch));
  const int64_t share = std::max<int64_t>(1, rows / ranks);
  for (int64_t begin = 0; begin < rows; begin += share)
    std::shuffle(order.begin() + begin, order.begin() + begin + share, random);
  return order;
}

}  // namespace dray
