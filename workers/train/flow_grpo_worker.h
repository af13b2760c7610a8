// FlowGrpoWorker: the worker class that trains Qwen-Image-Edit or FLUX.1
// Kontext with Flow-GRPO (or supervised fine-tuning, or Qwen's VAE as an
// autoencoder), one process per GPU, holding the model as the edit worker
// does (workers/pipeline/edit_model.h; its denoising through
// edit_diffusion.h) with LoRA adapters on the transformer (or the
// whole transformer trainable, or with algorithm.name vae the whole VAE),
// always sharded with FSDP's design (NO_SHARD is DDP), and an AdamW
// optimizer over the trainable parameters:
//
//   init_model        ONE_TO_ALL        meta "config": the resolved TrainConfig (ToYaml);
//                                       returns the memory figures as meta
//   rollout           DP_COMPUTE_PROTO  the edit batch columns (image, instruction,
//                                       seed) and meta sde_window_begin/end in;
//                                       final_edited_images (raw RGB) out. The rank
//                                       keeps its rows and their SDE window's
//                                       trajectory (latents, next_latents [B, T, S, C],
//                                       log_probs, timesteps [B, T]) and final latents
//                                       until the next rollout; meta return_trajectory:
//                                       true returns the window's too. diffusion_nft:
//                                       the sampling policy's ODE rollout (no window)
//   edit              DP_COMPUTE_PROTO  the edit batch columns in; final_edited_images
//                                       (raw RGB) out: the current policy's deterministic
//                                       edits (SFT's sample grids)
//   compute_log_prob  DP_COMPUTE_PROTO  rollout_row [B] in (rows of the rank's last
//                                       rollout); the log_probs [B, T] of their steps
//                                       under the current policy
//   adopt_rollout     DP_COMPUTE_METRIC the edit batch columns and a rollout's
//                                       trajectory (latents, next_latents, log_probs,
//                                       timesteps, as rollout returns them) in: kept as
//                                       if this rank had sampled it (trainer.async: another
//                                       group did), its log_probs as the behaviour
//                                       policy's
//   update_actor      DP_COMPUTE_METRIC rollout_row and advantages [B] in, meta
//                                       train_steps (window steps to train, JSON list)
//                                       and lr: one optimizer step on those rows of the
//                                       rank's last rollout; returns the step's
//                                       metrics as meta. With diffusion_nft:
//                                       row_train_steps [B, K] (schedule steps) in
//                                       place of train_steps, meta inner_epoch and,
//                                       on a step's last epoch, sampling_policy_decay:
//                                       one step on DiffusionNFT's loss
//                                       (workers/rl/nft_loss.h), then the sampling
//                                       policy's update
//   sft_update        DP_COMPUTE_METRIC the edit columns, target_images and sigma_draws
//                                       [B] in, meta lr: one optimizer step on the
//                                       flow-matching loss (workers/train/sft.h); returns
//                                       loss and grad_norm as meta
//   dpo_update        DP_COMPUTE_METRIC the edit columns, target_images (chosen),
//                                       rejected_images and sigma_draws [B, draws] in,
//                                       meta lr: one optimizer step on Diffusion-DPO's
//                                       loss (workers/rl/dpo_loss.h) against the
//                                       reference (LoRA: adapters off; else a frozen
//                                       copy); returns loss, implicit_acc, dpo_margin
//                                       and grad_norm as meta
//   vae_update        DP_COMPUTE_METRIC the edit columns and target_images in, meta lr:
//                                       one optimizer step of the VAE on every input and
//                                       target (workers/train/vae_training.h); returns
//                                       loss, reconstruction_rmse, kl, latent_std and
//                                       grad_norm as meta
//   dmd2_update       DP_COMPUTE_METRIC the edit columns in, meta lr, guidance_lr,
//                                       simulated_steps and update_generator: DMD2's
//                                       step (workers/rl/dmd2.h): the generator's
//                                       samples after backward simulation, with
//                                       update_generator its optimizer step on the
//                                       distribution-matching loss against the real
//                                       score (LoRA: adapters off; else a frozen copy)
//                                       and the fake score (a trainable copy), then the
//                                       fake score's step on its denoising loss of
//                                       those samples; with cls_on_clean_image the GAN's
//                                       losses too (a classifier head on the fake score
//                                       tells the rows' target_images from the samples);
//                                       returns loss_dm, grad_norm, loss_fake_mean,
//                                       fake_grad_norm (and gen_cls_loss,
//                                       guidance_cls_loss, pred_realism_on_real,
//                                       pred_realism_on_fake) as meta
//   reconstruct       DP_COMPUTE_PROTO  the edit columns in; the VAE's reconstructions of
//                                       the inputs (final_edited_images, raw RGB) out
//   save              ONE_TO_ALL        meta "dir": rank 0 writes the trained weights
//                                       there (LoRA: pytorch_lora_weights.safetensors;
//                                       else transformer/ or vae/ in diffusers' layout)
//   save_checkpoint   ONE_TO_ALL        meta "dir" (an existing directory): each rank
//                                       writes its shards of the trainable weights and of
//                                       AdamW's moments, and the optimizer's step count
//                                       (meta weights_only: true: the weights alone)
//   load_checkpoint   ONE_TO_ALL        meta "dir": restores them, whatever world size
//                                       wrote them
//   timings           ONE_TO_ALL        the seconds this rank has spent inside each method
//                                       so far, as meta (for the controller's share of a step)
//
// The KL term's reference policy is the base model (LoRA adapters off) or,
// for full fine-tuning, a frozen sharded copy of the initial transformer.
// update_actor accumulates the gradient of every micro-batch and trained
// step (the loss divided by their count), averages it over ranks, clips its
// global norm and steps the optimizer. Its first call after a rollout
// reports logprob_gap_max and logprob_gap_mean, |this policy's - the
// sampler's| at the trained steps. On an adopted rollout, the old policy
// is this one before that first call's step (its log-probs and step means
// kept for the calls after), and each sample's surrogate is weighted by
// its importance ratio old / behaviour, truncated at
// algorithm.rollout_is_threshold (metrics rollout_is_mean,
// rollout_is_clipfrac). A loss that is not finite is
// DATA_LOSS naming the step, and no parameter changes. A rank draws nothing
// at random but from seeds the controller sends (each row's seed, the
// step's), so a checkpoint needs no random-generator state; with
// diffusion_nft it holds the sampling policy too (laid out like the
// trained shards, DiffusionNFT's "old" adapter).
#ifndef DRAY_WORKERS_TRAIN_FLOW_GRPO_WORKER_H_
#define DRAY_WORKERS_TRAIN_FLOW_GRPO_WORKER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "dispatch/data_proto.h"
#include "runtime/worker/worker.h"
#include "workers/train/training_protocol.h"

namespace dray {

// kFlowGrpoRole: the role FlowGrpoWorker is registered under.
inline constexpr char kFlowGrpoRole[] = "flow_grpo";

class FlowGrpoWorker : public Worker {
 public:
  FlowGrpoWorker();
  ~FlowGrpoWorker() override;

  absl::StatusOr<DataProto> InitModel(const DataProto& input);
  absl::StatusOr<DataProto> Rollout(const DataProto& batch);
  absl::StatusOr<DataProto> ComputeLogProb(const DataProto& batch);
  absl::StatusOr<DataProto> Edit(const DataProto& batch);
  absl::StatusOr<DataProto> AdoptRollout(const DataProto& batch);
  absl::StatusOr<DataProto> UpdateActor(const DataProto& batch);
  absl::StatusOr<DataProto> SftUpdate(const DataProto& batch);
  absl::StatusOr<DataProto> DpoUpdate(const DataProto& batch);
  absl::StatusOr<DataProto> VaeUpdate(const DataProto& batch);
  absl::StatusOr<DataProto> Dmd2Update(const DataProto& batch);
  absl::StatusOr<DataProto> Reconstruct(const DataProto& batch);
  absl::StatusOr<DataProto> Save(const DataProto& input);
  absl::StatusOr<DataProto> SaveCheckpoint(const DataProto& input);
  absl::StatusOr<DataProto> LoadCheckpoint(const DataProto& input);
  absl::StatusOr<DataProto> Timings();

 private:
  // NftUpdate: update_actor's step with diffusion_nft.
  absl::StatusOr<DataProto> NftUpdate(const DataProto& batch);

  struct State;
  std::unique_ptr<State> state_;  // set by init_model
  MetaInfo seconds_in_methods_;   // method name -> seconds (double), for timings
};

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_FLOW_GRPO_WORKER_H_
