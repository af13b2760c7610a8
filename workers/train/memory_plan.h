// The memory plan behind `dray plan`: each rank's peak memory in one
// training step (forward, backward, gradient clipping, AdamW) of an MMDiT
// transformer (FLUX.1 Kontext's, Qwen-Image's) sharded by
// FullyShardedModule (runtime/sharding/fully_sharded.h), from first
// principles: the parameter counts of the model built shape-only
// (workers/train/plan_model.h) and the tensors dray's code allocates and
// autograd keeps, term by term.
//
//   DRAY_ASSIGN_OR_RETURN(PlanModel model, LoadPlanModel("flux-real", {32, {}}));
//   PlanOptions options;  // 1024x1024, bfloat16, FULL_SHARD ...
//   options.world_size = 4;
//   DRAY_ASSIGN_OR_RETURN(MemoryPlan plan, PlanMemory(model, options));
//   FitVerdict verdict = Verdict(plan, int64_t{24} << 30);
//
// Notation: W ranks, G ranks per shard group (W; HYBRID_*: shard_group_size;
// NO_SHARD: 1), c bytes per element of the compute dtype (bfloat16 2,
// float32 4), B the micro-batch, D the inner width, H attention heads, S
// tokens (text, noisy image, condition images: (height / 16) (width / 16)
// per image). Unit u (a block) holds T_u trainable and F_u frozen
// parameters, each flat parameter padded to a multiple of G (T^_u, F^_u);
// R_t and R_f parameters lie outside every unit (embedders, final norm and
// projection), replicated. N = sum_u T^_u / G + R_t: this rank's masters.
//
//   parameters   float32 masters 4 N; frozen shards c sum_u F^_u / G;
//                replicated copies c R_f (+ c R_t under mixed precision);
//                gathered units c (T^_u + F^_u) each: FULL_SHARD and
//                HYBRID_SHARD the unit running and those prefetched,
//                limit_all_gathers in all; SHARD_GRAD_OP and
//                HYBRID_SHARD_ZERO2 every unit from the first to the one in
//                backward (kept from forward). NO_SHARD (float32 only): the
//                parameters themselves, unsharded.
//   gradients    master gradients 4 N: LibTorch 1.13's zero_grad zeroes
//                and keeps them; 2's frees them, so in backward only the
//                units reduced so far have theirs. In backward the running
//                unit's gradients, c T_u, and the replicated ones', c R_t;
//                while unit u is reduced, its gradients and their flat
//                copy, 2 c T^_u (Gloo: c T^_u / G more).
//   optimizer    AdamW's two moments 8 N; in the step, clipping's float64
//                copies of the largest master's gradient, 16 T^_u / G.
//   activations  what autograd keeps for backward, counted op by op from
//                the blocks' code (memory_plan.cc): a block keeps k B S D
//                bytes, k by what trains (full fine-tuning / LoRA on the
//                attention and MLP projections):
//                               LibTorch 2, fused    1.13, blockwise
//                               bfloat16  float32    bfloat16  float32
//                  dual-stream   56 / 44  96 / 72     64 / 52  108 / 84
//                  single-stream 50 / 32  84 / 48     56 / 38   92 / 56
//                The blockwise kernel also keeps the attention
//                probabilities, c B H S^2; a fused one (flash,
//                memory-efficient) a float32 log-sum-exp, 4 B H S. LibTorch
//                1.13 keeps RoPE's float32 inputs too (8 of k), 2 does not.
//                With activation checkpointing each block keeps only its
//                input, c B S D, and the block in backward is recomputed
//                whole. A block's backward adds the gradients flowing in
//                and out, 2 c B S D, and its attention's (blockwise: two
//                blocks of at most 2^24 scores; fused: dq, dk, dv and a
//                float32 dq, (3c + 4) B S D).
//   buffers      frozen models in the compute dtype (resident: all;
//                sharded: 1/G; offloaded or pre-encoded: none); the inputs
//                and output; all-gather buffers (a master shard cast to the
//                compute dtype, c T^_u / G, and Gloo's staging copy of the
//                gathered flat parameter, c T^_u; NCCL gathers in place);
//                the CUDA context (outside the allocator; a stated guess).
//   allocator    a stated fraction of the rest, for the caching
//                allocator's fragmentation (0 for the CPU counter).
//
// With cpu_offload, the units' masters, their gradients, AdamW's state for
// them and the frozen shards live in host memory (MemoryPlan::host_bytes),
// not on the device; replicated parameters stay there whole.
// The peak is the largest total over the step's moments: each block's
// backward (its activations and those of the blocks before it kept), each
// unit's gradient reduction (the block's own activations freed), each
// re-gather in backward, and the optimizer step. The step is a steady one
// (the second on): AdamW's state exists. `dray bench --suite plan` checks
// the plan against measured peaks on the CPU (within 0.92-1.04 of them on
// LibTorch 1.13, 0.94-1.09 on 2.6).
//
// Thread-safety: pure functions of their arguments.
#ifndef DRAY_WORKERS_TRAIN_MEMORY_PLAN_H_
#define DRAY_WORKERS_TRAIN_MEMORY_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "absl/status/statusor.h"
#include "runtime/sharding/strategy.h"
#include "workers/models/layers.h"

namespace dray {

// BlockKind: a transformer block's layout (MMDiT).
enum class BlockKind {
  kDualStream,    // text and image streams, joint attention (FLUX.1's first 19, Qwen-Image's)
  kSingleStream,  // one stream, attention and MLP side by side (FLUX.1's last 38)
};

// BlockTraining: which of a block's layers train (their weights or a LoRA
// adapter on them): autograd keeps a layer's input only for the gradient
// of something that trains.
struct BlockTraining {
  bool modulation = true;     // the AdaLN linears (norm1.linear, img_mod.1, norm.linear, ...)
  bool projections = true;    // q, k, v (single-stream: and proj_mlp, on the same input)
  bool qk_norms = true;       // the per-head RMS norms of q and k
  bool attention_out = true;  // to_out.0 and to_add_out (single-stream: proj_out)
  bool mlp_in = true;         // dual-stream: the MLPs' first linears (net.0.proj)
  bool mlp_out = true;        // dual-stream: the MLPs' second linears (net.2)
};

// PlanUnit: one block, a sharding unit.
struct PlanUnit {
  BlockKind kind = BlockKind::kDualStream;
  int64_t trainable = 0;  // parameters that train (full: all; LoRA: the adapters)
  int64_t frozen = 0;     // parameters that do not (LoRA: the base weights)
  BlockTraining training;
};

// Placement: where a frozen model is during training.
enum class Placement {
  kResident,    // on the device, whole
  kSharded,     // on the device, FSDP-sharded (1/G of it)
  kOffloaded,   // in host memory, moved in to encode
  kPreEncoded,  // not loaded: its outputs were computed ahead
};

// FrozenComponent: a model beside the transformer that does not train.
struct FrozenComponent {
  std::string name;  // "T5 encoder (text_encoder_2)", ...
  int64_t parameters = 0;
  bool text_encoder = true;  // false: the VAE
};

// PlanModel: what the plan needs of a model, counted from a shape-only build.
struct PlanModel {
  std::string name;             // "FLUX.1 Kontext (flux-real)"
  std::vector<PlanUnit> units;  // the transformer's blocks, in the order they run
  int64_t replicated_trainable = 0;
  int64_t replicated_frozen = 0;
  bool embedders_train = true;  // the input projections (their inputs are kept)
  int64_t dim = 0;              // inner width D
  int64_t heads = 0;            // H
  int64_t text_dim = 0;         // the text encoder's width (the transformer's text input)
  int64_t pooled_dim = 0;       // pooled text input (FLUX.1: CLIP's; 0: none)
  int64_t latent_channels = 0;  // packed latent channels per image token
  int64_t default_text_tokens = 0;
  std::vector<FrozenComponent> frozen;
  // text_encoders: where training keeps the text encoders unless told
  // (dray train shards Qwen-Image's Qwen2.5-VL and FLUX.1's T5; counted
  // with CLIP, which it replicates: 0.17 GiB at W = 4).
  Placement text_encoders = Placement::kResident;

  int64_t parameters() const;  // the transformer's, adapters included
  int64_t trainable() const;
};

// LibTorch: the version a job runs on, where it changes what is held.
enum class LibTorch {
  k1_13,  // Debian 12's: zero_grad zeroes gradients and keeps them; RoPE's
          // complex product keeps its float32 input; blockwise attention only
  k2,     // 2.x (GPU builds, Debian 13's): zero_grad frees gradients (set_to_none)
};

// Collectives: the backend, for its buffers.
enum class Collectives {
  kNccl,  // gathers and reduces in place
  kGloo,  // dray's Gloo: a staging copy per all-gather, a receive buffer per reduce-scatter
};

// PlanOptions: the training step planned.
struct PlanOptions {
  int world_size = 1;
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  int shard_group_size = 0;              // HYBRID_*: ranks per shard group; 0: world_size
  at::ScalarType dtype = at::kBFloat16;  // compute dtype over float32 masters
  bool cpu_offload = false;
  bool activation_checkpointing = false;
  int limit_all_gathers = 1;  // units gathered at once (1: no prefetch, dray's trainer)
  int64_t micro_batch = 1;
  int64_t height = 1024, width = 1024;  // pixels, multiples of 16
  int64_t condition_images = 1;         // Kontext, Qwen-Image-Edit: 1
  int64_t text_tokens = 0;              // 0: the model's default (FLUX.1: T5's 512)
  LibTorch libtorch = LibTorch::k2;
  AttentionKernel attention = AttentionKernel::kFused;  // LibTorch 2 only
  Collectives collectives = Collectives::kNccl;
  std::optional<Placement> text_encoders;  // unset: PlanModel::text_encoders
  Placement vae = Placement::kResident;
  double allocator_overhead = 0.10;   // fraction of the rest
  int64_t context_bytes = 512 << 20;  // CUDA context and kernel images

  // Validate: INVALID_ARGUMENT naming the flag (and the train-config key)
  // of a value out of range or a combination dray's FSDP refuses.
  absl::Status Validate() const;
};

// MemoryTerm: one line of the plan.
struct MemoryTerm {
  std::string name;  // parameters, gradients, optimizer, activations, buffers, allocator
  int64_t bytes = 0;
  std::string detail;  // its parts, e.g. "masters 0.09 GiB + frozen shards 5.5 GiB + ..."
};

// MemoryPlan: one rank's peak.
struct MemoryPlan {
  std::vector<MemoryTerm> terms;
  int64_t total = 0;
  std::string peak_at;     // the moment of the step: "backward of block 57 of 57 (single-stream)"
  int64_t host_bytes = 0;  // host memory per rank for what cpu_offload keeps there
  int64_t image_tokens = 0, text_tokens = 0;
};

// PlanMemory: one rank's peak in a steady step of `model` trained as
// `options` say; INVALID_ARGUMENT as Validate says, or for a model without
// blocks.
absl::StatusOr<MemoryPlan> PlanMemory(const PlanModel& model, const PlanOptions& options);

// FitVerdict: whether the plan fits `device_bytes`, and why.
struct FitVerdict {
  bool fits = false;
  std::string dominant;  // the largest term
  std::string reason;    // one sentence
};
FitVerdict Verdict(const MemoryPlan& plan, int64_t device_bytes);

// FormatBytes: "23.50 GiB", or below 0.1 GiB "12.3 MiB".
std::string FormatBytes(int64_t bytes);

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_MEMORY_PLAN_H_
