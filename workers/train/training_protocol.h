// The columns and meta keys a training job's controller (FlowGrpoTrainer,
// its PromptSampler and algorithms) and its workers (FlowGrpoWorker)
// exchange, in one place: TrainingWorkers' calls carry them
// (training_workers.h), the workers read them. Names only: it depends on
// nothing.
#ifndef DRAY_WORKERS_TRAIN_TRAINING_PROTOCOL_H_
#define DRAY_WORKERS_TRAIN_TRAINING_PROTOCOL_H_

namespace dray {

// A rollout's trajectory stays on the rank that sampled it; rollout
// returns it only when asked (kReturnTrajectoryKey), in these columns, and
// adopt_rollout takes it so (trainer.async).
inline constexpr char kLatentsColumn[] = "latents";
inline constexpr char kNextLatentsColumn[] = "next_latents";
inline constexpr char kLogProbsColumn[] = "log_probs";
inline constexpr char kTimestepsColumn[] = "timesteps";
// compute_log_prob's and update_actor's rows: each one's index among the
// rows of its rank's last rollout (int64 [B]; DP_COMPUTE_PROTO gave rank r
// rows [r * B / W, (r + 1) * B / W) of a rollout of B rows on W ranks), and
// update_actor's advantages (double [B]).
inline constexpr char kRolloutRowColumn[] = "rollout_row";
inline constexpr char kAdvantagesColumn[] = "advantages";
// update_actor (optional): each row's own trained window steps, int64
// [B, K], in place of meta train_steps' (DanceGRPO); nft_update: each
// row's trained schedule steps, in the order trained (update_actor with
// diffusion_nft).
inline constexpr char kRowTrainStepsColumn[] = "row_train_steps";
// SFT's columns: the edited image each row asks for, and a draw in [0, 1)
// picking the row's noise level from the schedule (workers/train/sft.h;
// DPO: [B, draws], one per noise draw of the pair).
inline constexpr char kTargetsColumn[] = "target_images";
inline constexpr char kSigmaDrawsColumn[] = "sigma_draws";
// DPO's: the edit each row prefers its target over (raw or encoded images).
inline constexpr char kRejectedColumn[] = "rejected_images";
// rollout (optional): each row's own seed, from which its SDE noise is
// drawn, where a group's rows share their `seeds` and so their initial
// noise (DanceGRPO's init_same_noise; int64 [B]).
inline constexpr char kSdeSeedsColumn[] = "sde_seeds";

// Meta keys. rollout: the SDE window's first step and the step after its
// last (int64).
inline constexpr char kSdeWindowBeginKey[] = "sde_window_begin";
inline constexpr char kSdeWindowEndKey[] = "sde_window_end";
// rollout: true to return the trajectory too (bool; for tests and tools).
inline constexpr char kReturnTrajectoryKey[] = "return_trajectory";
// update_actor: the window's trained steps (a JSON list of int64).
inline constexpr char kTrainStepsKey[] = "train_steps";
// update_actor, sft_update, vae_update: this step's learning rate (double).
inline constexpr char kLearningRateKey[] = "lr";
// update_actor with diffusion_nft: the inner epoch (int64: its noise draws differ by epoch) and,
// on the step's last, the sampling policy's decay after the optimizer step
// (double, rl::NftOldPolicyDecay).
inline constexpr char kInnerEpochKey[] = "inner_epoch";
// rollout, dpo_update: true to make the sampling policy (DPO's reference,
// algorithm.ref_update_step) the policy first (bool).
inline constexpr char kRefreshSamplingPolicyKey[] = "refresh_sampling_policy";
inline constexpr char kSamplingPolicyDecayKey[] = "sampling_policy_decay";
// dmd2_update: the generator steps backward simulation runs before the
// trained one (int64), and whether the generator learns (bool; the fake
// score always does).
inline constexpr char kSimulatedStepsKey[] = "simulated_steps";
inline constexpr char kUpdateGeneratorKey[] = "update_generator";
// dmd2_update: the fake score's learning rate this step (double).
inline constexpr char kGuidanceLearningRateKey[] = "guidance_lr";
// save, save_checkpoint, load_checkpoint: the folder (string).
inline constexpr char kDirKey[] = "dir";
// save_checkpoint, load_checkpoint: true for the trained weights alone, no
// optimizer state (bool; trainer.async's weight syncs).
inline constexpr char kWeightsOnlyKey[] = "weights_only";

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_TRAINING_PROTOCOL_H_
