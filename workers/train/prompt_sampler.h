// PromptSampler: what each training step works on, drawn from trainer.seed
// and the step alone, so that a resumed run needs only its step count and
// no draw depends on the number of workers:
//
//   - the step's prompts: prompts_per_step of them, every prompt once per
//     pass over the data, in a seeded order of each pass; where the data
//     holds images of several sizes, the step's other prompts are drawn
//     from the first one's size (a batch decodes to one shape);
//   - the rows the workers sample from: each prompt's image and
//     instruction, group_size times for GRPO's group (once for SFT and VAE
//     pairs, with the target and a sigma draw each), each row with a
//     sampling seed of its own;
//   - GRPO's SDE window (drawn, or MixGRPO's sliding one), the window's
//     steps that are trained, and the order of the rows in each inner
//     epoch.
//
// Each kind of draw has a stream of its own (SeedStream), so that a new kind
// never shifts the others: a run's draws stay bit-exact across versions.
//
//   PromptSampler sampler(config, std::move(prompts));
//   DRAY_ASSIGN_OR_RETURN(DataProto rows, sampler.RolloutRows(step));
//   for (const TrainPrompt* prompt : sampler.PromptsOf(step)) ...
//
// Thread-safety: immutable after construction; safe to use from several
// threads.
#ifndef DRAY_WORKERS_TRAIN_PROMPT_SAMPLER_H_
#define DRAY_WORKERS_TRAIN_PROMPT_SAMPLER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "dispatch/data_proto.h"
#include "workers/train/train_config.h"
#include "workers/train/train_data.h"

namespace dray {

// SeedStream: one per kind of draw. The numbers are part of every run's
// results: never renumber, only add.
enum class SeedStream : uint64_t {
  kPromptOrder = 1,      // the order of the prompts in each pass over the data
  kSampleSeed = 2,       // each row's sampling seed
  kSdeWindow = 3,        // where GRPO's SDE window starts
  kTrainedSteps = 4,     // which of the window's steps are trained
  kUpdateOrder = 5,      // the rows' order in each inner epoch
  kSigmaDraw = 6,        // SFT's and VAE's noise level per pair
  kSameSizePrompts = 7,  // the step's other prompts, of the first one's size
  kRowTrainedSteps = 8,  // DanceGRPO's trained steps of each row
  kSimulatedSteps = 9,   // DMD2's backward-simulated generator steps
};

// StreamSeed: a seed for draw `index` of `stream` in a job seeded `seed`
// (splitmix64 of the three).
uint64_t StreamSeed(uint64_t seed, SeedStream stream, uint64_t index);

class PromptSampler {
 public:
  // `prompts` must not be empty (ReadTrainPrompts refuses empty data).
  PromptSampler(const TrainConfig& config, std::vector<TrainPrompt> prompts);

  const std::vector<TrainPrompt>& prompts() const { return prompts_; }

  // PromptsOf: step `step`'s prompts_per_step prompts, in row order.
  std::vector<const TrainPrompt*> PromptsOf(int64_t step) const;

  // RolloutRows: GRPO's rows (MakeEditBatch's columns), group_size per
  // prompt (DPO's: asking for its reference's refresh, AskForRefresh, as
  // PairedRows do), with the SDE window in meta "sde_window_begin" and
  // "sde_window_end" (dance_grpo, mix_grpo with init_same_noise: a group's rows share
  // their first row's seed, their own in kSdeSeedsColumn).
  absl::StatusOr<DataProto> RolloutRows(int64_t step) const;

  // Dmd2Rows: DMD2's rows, one per prompt, with the generator steps its
  // backward simulation runs (kSimulatedStepsKey: a seeded draw in [0,
  // num_denoising_step), one for all rows as DMD2 broadcasts it; 0 without
  // backward simulation) and whether the generator learns this step
  // (kUpdateGeneratorKey: every dfake_gen_update_ratio-th step); with
  // cls_on_clean_image each row's target (kTargetsColumn, the GAN's real
  // image: INVALID_ARGUMENT naming a row that has none).
  absl::StatusOr<DataProto> Dmd2Rows(int64_t step) const;

  // PairedRows: SFT's and VAE's rows, one per prompt, with its target image
  // and a sigma draw in [0, 1) (kTargetsColumn, kSigmaDrawsColumn); DPO's
  // with the rejected image too (kRejectedColumn) and dpo_draws()
  // logit-normal draws per row ([B, draws]).
  absl::StatusOr<DataProto> PairedRows(int64_t step) const;

  // SdeWindowOf: step `step`'s SDE window [begin, end): every step but the
  // last (dance_grpo: every step), a seeded window of sde_window_size
  // within sde_window_range, or mix_grpo's sliding window (empty at the
  // schedule's end).
  std::pair<int64_t, int64_t> SdeWindowOf(int64_t step) const;

  // DpoDraws: DPO's logit-normal draws in (0, 1) for `rows` pairs of step
  // `step`, dpo_draws() each ([rows, draws]; kSigmaDrawsColumn).
  at::Tensor DpoDraws(int64_t step, int64_t rows) const;

  // TrainedSteps: which of a `window`-step SDE window's steps step `step`
  // trains: a seeded timestep_fraction of them (at least one of a non-empty
  // window), ascending; dance_grpo's of all but the last, rounded down.
  std::vector<int64_t> TrainedSteps(int64_t step, int64_t window) const;

  // RowTrainedSteps: DanceGRPO's and DiffusionNFT's own subset per sample:
  // for each of `rows` rows, its own seeded subset as TrainedSteps draws
  // one ([rows, K] int64, in permuted order, the order they train them in),
  // drawn afresh in each inner epoch.
  at::Tensor RowTrainedSteps(int64_t step, int64_t rows, int64_t window, int64_t epoch = 0) const;

  // UpdateOrder: the order of `rows` rows in inner epoch `epoch`: the
  // rollout's in the first (so the first update's micro-batches are the
  // rollout's, and it recomputes the rollout's log-probs bit for bit: an
  // epoch is one optimizer step on every row, whatever their order), then shuffled
  // within each of `ranks` equal shares, as flow_grpo shuffles within each
  // process: a row stays on the rank that sampled it, whose encodings it
  // reuses.
  std::vector<int64_t> UpdateOrder(int64_t step, int64_t epoch, int64_t rows, int ranks) const;

 private:
  // EditRows: each of the step's prompts `copies` times, each row seeded
  // (with `shared_initial_noise`, a prompt's copies share its first row's
  // seed, their own in kSdeSeedsColumn).
  absl::StatusOr<DataProto> EditRows(int64_t step, int64_t copies,
                                     bool shared_initial_noise = false) const;
  uint64_t Seed(SeedStream stream, uint64_t index) const;
  // AskForRefresh marks `batch` to make DPO's reference the policy first
  // on every ref_update_step-th step (kRefreshSamplingPolicyKey), as
  // flow_grpo's copy_learner_to_ref at those global steps.
  void AskForRefresh(int64_t step, DataProto& batch) const;
  // SeededSubset: a `window`-step window's trained steps in the order a
  // generator seeded `seed` shuffles them: timestep_fraction of them, at
  // least one (dance_grpo: int((window - 1) fraction), never the last;
  // diffusion_nft: int(window fraction)).
  std::vector<int64_t> SeededSubset(uint64_t seed, int64_t window) const;
  // UniformDraws: `count` draws in [0, 1) of step `step`'s kSigmaDraw stream.
  at::Tensor UniformDraws(int64_t step, int64_t count) const;

  TrainConfig config_;
  std::vector<TrainPrompt> prompts_;
  std::vector<std::vector<size_t>> buckets_;  // prompts by input image size
  std::vector<size_t> bucket_of_;             // each prompt's bucket
};

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_PROMPT_SAMPLER_H_
