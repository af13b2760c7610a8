// GrpoAlgorithm: Flow-GRPO's step (algorithm.name grpo): the step's rows
// rolled out with the SDE sampler, every sample scored (the built-in
// functions where worker.reward.placement runs them, the remote scorers
// meanwhile), group advantages from the registered estimator, and
// num_inner_epochs updates of the clipped surrogate on a seeded share of
// the window's steps, the rows shuffled within each rank's share (none when
// MixGRPO's window is empty). As algorithm.name dpo with dpo_pairs
// samples (flow_grpo's DPO), the update is DPO's on each prompt's best and
// worst sample instead; as diffusion_nft, the rollouts are its sampling
// policy's ODE ones and the updates its loss's. With trainer.async, the
// rollouts come from a rollout group of their own, a step ahead
// (workers/train/async_rollouts.h).
// docs/training.md walks through it.
//
// Thread-safety: not thread-safe.
#ifndef DRAY_WORKERS_TRAIN_GRPO_ALGORITHM_H_
#define DRAY_WORKERS_TRAIN_GRPO_ALGORITHM_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "workers/rl/advantages.h"
#include "workers/train/async_rollouts.h"
#include "workers/train/remote_reward.h"
#include "workers/train/rewards.h"
#include "workers/train/training_algorithm.h"

namespace dray {

class GrpoAlgorithm : public TrainingAlgorithm {
 public:
  // Create finds the advantage estimator and connects to the remote
  // scorers (each must answer an empty request).
  static absl::StatusOr<std::unique_ptr<GrpoAlgorithm>> Create(const TrainConfig& config);

  absl::StatusOr<Metrics> Step(int64_t step, const StepContext& context) override;
  std::vector<ChartSpec> Charts() const override;

 private:
  explicit GrpoAlgorithm(const TrainConfig& config) : config_(config) {}

  // Scores: each sample's reward (weighted sum) and each reward's score of
  // it ([N, rewards]: the functions, then the remote scorers) with its weight.
  struct Scores {
    std::vector<double> total;
    at::Tensor by_reward;
    std::vector<double> weights;
  };
  // Rewards scores the step's samples (each reward's mean into `metrics`).
  absl::StatusOr<Scores> Rewards(int64_t step, const StepContext& context, const DataProto& rollout,
                                 const DataProto& rows, Metrics& metrics) const;
  // FunctionScores: each built-in function's score of each sample [B, F],
  // where worker.reward.placement runs them.
  absl::StatusOr<at::Tensor> FunctionScores(int64_t step, const StepContext& context,
                                            const std::vector<RewardInput>& samples,
                                            const DataProto& rollout, const DataProto& rows) const;
  // PreferenceUpdate: DPO's step on the rollout (algorithm.name dpo with
  // dpo_pairs samples): each prompt's best and worst sample by reward
  // (rl::DpoPairs) as its chosen and rejected edit; its metrics into `metrics`.
  absl::Status PreferenceUpdate(int64_t step, const StepContext& context, const DataProto& rows,
                                const DataProto& rollout, const std::vector<double>& rewards,
                                Metrics& metrics) const;
  // UpdateBatch: update_actor's rows (each named by its place in its rank's
  // share of the rollout) with their advantages, and the step's lr.
  absl::StatusOr<DataProto> UpdateBatch(const StepContext& context,
                                        const at::Tensor& advantages) const;
  // InnerEpochs runs num_inner_epochs update_actor calls on `batch` (the
  // first in the rollout's order, the others shuffled within each rank's
  // share; `for_epoch`, when given, adds what that epoch's call needs) and
  // combines the ranks' metrics into `metrics` (each key averaged over the
  // calls that report it, "..._max" keys by their maximum); with on_nan
  // skip, a step whose loss is not finite is skipped ("skipped": 1).
  absl::Status InnerEpochs(
      int64_t step, const StepContext& context, const DataProto& batch,
      const std::function<absl::Status(int64_t epoch, DataProto& batch)>& for_epoch,
      Metrics& metrics) const;
  // NftUpdate: DiffusionNFT's step on the rollout (algorithm.name
  // diffusion_nft): each row at its own shuffle of the schedule's
  // timesteps in each inner epoch; after the last, the workers move their
  // sampling policy toward the trained one (rl::NftOldPolicyDecay).
  absl::Status NftUpdate(int64_t step, const StepContext& context, const at::Tensor& advantages,
                         Metrics& metrics) const;
  // WithSamples writes the step's sample grid when one is due; `metrics` back.
  absl::StatusOr<Metrics> WithSamples(int64_t step, const StepContext& context,
                                      const DataProto& rollout, const std::vector<double>& rewards,
                                      Metrics metrics) const;
  // Samples: the step's prompts, each with its samples captioned by reward.
  absl::StatusOr<std::vector<SampleRow>> Samples(int64_t step, const StepContext& context,
                                                 const DataProto& rollout,
                                                 const std::vector<double>& rewards) const;

  TrainConfig config_;
  rl::AdvantageEstimator advantages_;
  std::unique_ptr<RemoteScorers> remote_scorers_;  // worker.reward.remote, if any
  std::unique_ptr<AsyncRollouts> async_;           // trainer.async
};

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_GRPO_ALGORITHM_H_
