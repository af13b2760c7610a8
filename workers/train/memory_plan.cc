#include "workers/train/memory_plan.h"

#include <algorithm>
#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/shape_string.h"

namespace dray {
namespace {

// The terms of a plan, in the order the table lists them.
enum Term { kParameters, kGradients, kOptimizer, kActivations, kBuffers, kTerms };
constexpr const char* kTermNames[kTerms] = {"parameters", "gradients", "optimizer", "activations",
                                            "buffers"};

struct Part {
  std::string name;
  int64_t bytes;
};

// Moment: what a rank holds at one point of the step, term by term.
struct Moment {
  std::string name;
  std::array<std::vector<Part>, kTerms> parts;

  void Add(Term term, std::string part, int64_t bytes) {
    if (bytes > 0) parts[term].push_back({std::move(part), bytes});
  }
  int64_t Sum(Term term) const {
    int64_t sum = 0;
    for (const Part& part : parts[term]) sum += part.bytes;
    return sum;
  }
  int64_t Total() const {
    int64_t total = 0;
    for (int term = 0; term < kTerms; ++term) total += Sum(static_cast<Term>(term));
    return total;
  }
};

int64_t RoundUp(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// QkPathBytes: what one of q or k keeps, per element: its projection's
// output (the RMS norm's input), the float32 copy the norm squares (below
// float32), the normed values before the weight (kept for the weight's
// gradient), and on LibTorch 1.13 RoPE's float32 input (its complex
// product keeps both factors; 2 keeps only the one the gradient needs).
int64_t QkPathBytes(int64_t c, bool norm_trains, LibTorch libtorch) {
  return c + (c < 4 ? 4 : 0) + (norm_trains ? c : 0) +
         (libtorch == LibTorch::k1_13 ? std::max<int64_t>(c, 4) : 0);
}

// AttentionBytes: what attention keeps per element of S x D besides its
// S^2 term: blockwise, q scaled, k transposed and v laid out for bmm (and
// in float32 the unnormalised output, for the deferred division); fused,
// q, k, v and the output.
int64_t AttentionBytes(int64_t c, AttentionKernel kernel) {
  return kernel == AttentionKernel::kFused ? 4 * c : 3 * c + (c >= 4 ? c : 0);
}

class Planner {
 public:
  Planner(const PlanModel& model, const PlanOptions& options)
      : m_(model),
        o_(options),
        c_(c10::elementSize(options.dtype)),
        group_(!ShardsParameters(options.strategy) ? 1
               : IsHybrid(options.strategy) && options.shard_group_size > 0
                   ? options.shard_group_size
                   : options.world_size),
        mixed_(options.dtype != at::kFloat),
        image_tokens_(options.height / 16 * (options.width / 16) * (1 + options.condition_images)),
        text_tokens_(options.text_tokens > 0 ? options.text_tokens : model.default_text_tokens),
        tokens_(image_tokens_ + text_tokens_) {}

  MemoryPlan Plan() const {
    std::vector<Moment> moments = {Optimizer()};
    for (size_t i = m_.units.size(); i-- > 0;) {
      moments.push_back(Backward(i));
      moments.push_back(Reduce(i));
      if (Regathers()) moments.push_back(Gather(i));
    }
    const Moment& peak =
        *std::max_element(moments.begin(), moments.end(),
                          [](const Moment& a, const Moment& b) { return a.Total() < b.Total(); });
    MemoryPlan plan;
    plan.peak_at = peak.name;
    plan.image_tokens = image_tokens_;
    plan.text_tokens = text_tokens_;
    plan.host_bytes = HostBytes();
    for (int term = 0; term < kTerms; ++term) {
      std::vector<std::string> details;
      for (const Part& part : peak.parts[term])
        details.push_back(absl::StrCat(part.name, " ", FormatBytes(part.bytes)));
      plan.terms.push_back(
          {kTermNames[term], peak.Sum(static_cast<Term>(term)), absl::StrJoin(details, " + ")});
    }
    const int64_t rest = peak.Total();
    const int64_t overhead = static_cast<int64_t>(o_.allocator_overhead * rest);
    plan.terms.push_back({"allocator", overhead,
                          absl::StrFormat("%.0f%% of the rest: the caching allocator's slack",
                                          100 * o_.allocator_overhead)});
    plan.total = rest + overhead;
    return plan;
  }

 private:
  bool Sharded() const { return ShardsParameters(o_.strategy); }
  bool Regathers() const { return ReshardsAfterForward(o_.strategy); }
  int64_t Padded(int64_t n) const { return RoundUp(n, group_); }
  int64_t UnitBytes(size_t i) const {
    return c_ * (Padded(m_.units[i].trainable) + Padded(m_.units[i].frozen));
  }
  // LocalTrainable: N, this rank's trainable masters; UnitMasters: those
  // of the units (what cpu_offload moves to the host: replicated masters
  // stay on the device).
  int64_t UnitMasters() const {
    int64_t n = 0;
    for (const PlanUnit& unit : m_.units) n += Padded(unit.trainable) / group_;
    return n;
  }
  int64_t LocalTrainable() const { return UnitMasters() + m_.replicated_trainable; }
  int64_t DeviceMasters() const {
    return o_.cpu_offload ? m_.replicated_trainable : LocalTrainable();
  }
  int64_t LocalFrozen() const {
    int64_t n = 0;
    for (const PlanUnit& unit : m_.units) n += Padded(unit.frozen) / group_;
    return n;
  }
  // LargestMaster: the most elements of one tensor the optimizer steps.
  int64_t LargestMaster() const {
    int64_t largest = 0;
    for (const PlanUnit& unit : m_.units)
      largest = std::max(largest, Padded(unit.trainable) / group_);
    return largest;
  }
  Placement PlacementOf(const FrozenComponent& component) const {
    return component.text_encoder ? o_.text_encoders.value_or(m_.text_encoders) : o_.vae;
  }
  int64_t FrozenComponentBytes(const FrozenComponent& component) const {
    const Placement placement = PlacementOf(component);
    if (placement == Placement::kResident) return c_ * component.parameters;
    if (placement == Placement::kSharded)
      return c_ * RoundUp(component.parameters, group_) / group_;
    return 0;
  }
  // HostBytes: masters, their gradients, AdamW's state and frozen shards
  // under cpu_offload, and offloaded frozen models.
  int64_t HostBytes() const {
    int64_t bytes = o_.cpu_offload ? 16 * UnitMasters() + c_ * LocalFrozen() : 0;
    for (const FrozenComponent& component : m_.frozen) {
      if (PlacementOf(component) == Placement::kOffloaded) bytes += c_ * component.parameters;
    }
    return bytes;
  }

  // Persistent: what every moment holds: parameters at rest, AdamW's
  // state, frozen models and the inputs.
  Moment Persistent(std::string name) const {
    Moment moment{std::move(name), {}};
    const int64_t n = DeviceMasters();
    moment.Add(kParameters, "float32 masters", 4 * n);
    moment.Add(kOptimizer, "AdamW moments", 8 * n);
    if (!o_.cpu_offload) {
      moment.Add(kParameters, absl::StrCat("frozen shards (", DtypeName(o_.dtype), ")"),
                 c_ * LocalFrozen());
    }
    moment.Add(kParameters, "replicated",
               c_ * m_.replicated_frozen + (mixed_ ? c_ * m_.replicated_trainable : 0));
    for (const FrozenComponent& component : m_.frozen)
      moment.Add(kBuffers, component.name, FrozenComponentBytes(component));
    moment.Add(kBuffers, "inputs and output", o_.micro_batch * InputBytes());
    moment.Add(kBuffers, "CUDA context", o_.context_bytes);
    return moment;
  }

  // InputBytes: one sample's latents (noisy and condition), text states,
  // pooled text and position ids, and the prediction the loss keeps.
  int64_t InputBytes() const {
    return c_ * (2 * image_tokens_ * m_.latent_channels + text_tokens_ * m_.text_dim +
                 m_.pooled_dim) +
           12 * tokens_;
  }

  // BlockBytes: what block i keeps for backward, its output included (the
  // next block's input), as the blocks compute (workers/models/flux/
  // transformer.cc, qwen_image/transformer.cc, joint_attention.cc,
  // layers.cc); autograd keeps a tensor only for a gradient it will
  // compute, so a layer's input stays only when the layer trains, and a
  // product's factor only when the other factor needs a gradient (the
  // AdaLN scales and gates need one only when the modulation trains).
  int64_t BlockBytes(size_t i) const {
    const PlanUnit& unit = m_.units[i];
    const BlockTraining& t = unit.training;
    const int64_t c = c_;
    int64_t per_element = 2 * QkPathBytes(c, t.qk_norms, o_.libtorch) +
                          AttentionBytes(c, o_.attention) +
                          4 * c /* MLP hidden, the GELU's input */ + c /* output */;
    if (unit.kind == BlockKind::kDualStream) {
      per_element += c /* residual after attention: the second norm's input */ +
                     (t.modulation ? 4 * c : 0) /* two normed inputs, two gated outputs */ +
                     (t.projections ? c : 0) /* modulated input of q, k, v */ +
                     (t.attention_out && o_.attention != AttentionKernel::kFused ? c : 0) +
                     (t.mlp_in ? c : 0) /* modulated MLP input */ +
                     (t.mlp_out ? 4 * c : 0) /* GELU output */;
    } else {
      per_element += (t.modulation ? 2 * c : 0) /* normed input, gated output */ +
                     (t.projections ? c : 0) /* modulated input of q, k, v, proj_mlp */ +
                     (t.attention_out ? 5 * c : 0) /* [attention, MLP] into proj_out */;
    }
    const int64_t per_sample =
        per_element * tokens_ * m_.dim + (o_.attention == AttentionKernel::kFused
                                              ? 4 * m_.heads * tokens_
                                              : c * m_.heads * tokens_ * tokens_);
    return o_.micro_batch * per_sample;
  }
  int64_t InputOfBlock() const { return o_.micro_batch * c_ * tokens_ * m_.dim; }
  int64_t EmbedderInputs() const {
    return m_.embedders_train
               ? o_.micro_batch * c_ *
                     (image_tokens_ * m_.latent_channels + text_tokens_ * m_.text_dim)
               : 0;
  }
  // KeptBefore: activations held when block i's backward starts, before it
  // runs (with checkpointing: the inputs of blocks 0..i).
  int64_t KeptBefore(size_t i) const {
    int64_t kept = InputOfBlock() + EmbedderInputs();
    for (size_t j = 0; j <= i; ++j)
      kept += o_.activation_checkpointing ? (j > 0 ? InputOfBlock() : 0) : BlockBytes(j);
    return kept;
  }
  int64_t AttentionBackward() const {
    if (o_.attention == AttentionKernel::kFused)
      return o_.micro_batch * (3 * c_ + 4) * tokens_ * m_.dim;
    return 2 * c_ * std::min(o_.micro_batch * m_.heads * tokens_ * tokens_, kAttentionBlockScores);
  }
  // FirstGathered: the first of the units gathered while block i is in
  // backward (the last is i); none (i + 1) unsharded.
  size_t FirstGathered(size_t i) const {
    if (!Sharded()) return i + 1;
    if (!Regathers()) return 0;
    return i + 1 - std::min<size_t>(i + 1, o_.limit_all_gathers);
  }
  std::string BlockName(size_t i) const {
    const char* kind = m_.units[i].kind == BlockKind::kDualStream ? "dual-stream" : "single-stream";
    return absl::StrCat("block ", i + 1, " of ", m_.units.size(), " (", kind, ")");
  }
  // MasterGradients: the float32 gradients on the device while block i is
  // in backward: all of them on LibTorch 1.13, whose zero_grad zeroes and
  // keeps them; on 2, whose zero_grad frees them, those of the units
  // reduced since (after block i).
  int64_t MasterGradients(size_t i) const {
    if (o_.libtorch == LibTorch::k1_13) return 4 * DeviceMasters();
    if (o_.cpu_offload) return 0;
    int64_t n = 0;
    for (size_t j = i + 1; j < m_.units.size(); ++j) n += Padded(m_.units[j].trainable) / group_;
    return 4 * n;
  }
  // InBackward: the parts every moment of block i's backward shares.
  Moment InBackward(std::string name, size_t i) const {
    Moment moment = Persistent(std::move(name));
    moment.Add(kGradients, "float32 master gradients", MasterGradients(i));
    int64_t gathered = 0;
    for (size_t j = FirstGathered(i); j <= i; ++j) gathered += UnitBytes(j);
    const size_t units = i + 1 - FirstGathered(i);
    moment.Add(kParameters,
               absl::StrCat("gathered ", units, units == 1 ? " unit (" : " units (",
                            DtypeName(o_.dtype), ")"),
               gathered);
    moment.Add(kGradients, "replicated gradients", mixed_ ? c_ * m_.replicated_trainable : 0);
    return moment;
  }
  Moment Backward(size_t i) const {
    Moment moment = InBackward(absl::StrCat("backward of ", BlockName(i)), i);
    moment.Add(kGradients, "the block's gradients", c_ * m_.units[i].trainable);
    moment.Add(kActivations, "kept", KeptBefore(i));
    moment.Add(kActivations, "the block recomputed",
               o_.activation_checkpointing ? BlockBytes(i) : 0);
    moment.Add(kActivations, "gradients in and out", 2 * InputOfBlock());
    moment.Add(kActivations, "attention's backward", AttentionBackward());
    return moment;
  }
  Moment Reduce(size_t i) const {
    Moment moment = InBackward(absl::StrCat("reducing the gradients of ", BlockName(i)), i);
    const int64_t flat = c_ * Padded(m_.units[i].trainable);
    // The unit's gradients and their flat copy; Gloo's reduce-scatter
    // receives every rank's copy of this rank's part, then sums it.
    const bool gloo_scatter = o_.collectives == Collectives::kGloo && Sharded();
    moment.Add(kGradients, "reduce buffers", 2 * flat + (gloo_scatter ? flat / group_ : 0));
    const int64_t kept = KeptBefore(i) - (o_.activation_checkpointing ? 0 : BlockBytes(i));
    moment.Add(kActivations, "kept", kept);
    moment.Add(kActivations, "the input's gradient", InputOfBlock());
    return moment;
  }
  // GatherBuffers: gathering unit i's flat parameters one after another,
  // each from its shard copied to the compute device and dtype where it is
  // not there already, through Gloo's staging copy.
  int64_t GatherBuffers(size_t i) const {
    const PlanUnit& unit = m_.units[i];
    const bool gloo = o_.collectives == Collectives::kGloo;
    int64_t largest = 0;
    for (const auto& [n, converted] : {std::pair{unit.trainable, mixed_ || o_.cpu_offload},
                                       std::pair{unit.frozen, o_.cpu_offload}}) {
      const int64_t flat = c_ * Padded(n);
      largest = std::max(largest, (converted ? flat / group_ : 0) + (gloo ? flat : 0));
    }
    return largest;
  }
  Moment Gather(size_t i) const {
    Moment moment = InBackward(absl::StrCat("gathering ", BlockName(i), " for backward"), i);
    moment.Add(kBuffers, "all-gather buffers", GatherBuffers(i));
    moment.Add(kActivations, "kept", KeptBefore(i));
    moment.Add(kActivations, "the output's gradient", InputOfBlock());
    return moment;
  }
  Moment Optimizer() const {
    Moment moment = Persistent("optimizer step");
    moment.Add(kGradients, "float32 master gradients", 4 * DeviceMasters());
    // Clipping sums each master's gradient in float64 on the compute device.
    moment.Add(kOptimizer, "step temporaries", 16 * LargestMaster());
    return moment;
  }

  const PlanModel& m_;
  const PlanOptions& o_;
  const int64_t c_;
  const int64_t group_;
  const bool mixed_;
  const int64_t image_tokens_, text_tokens_, tokens_;
};

}  // namespace

int64_t PlanModel::parameters() const {
  int64_t n = replicated_trainable + replicated_frozen;
  for (const PlanUnit& unit : units) n += unit.trainable + unit.frozen;
  return n;
}

int64_t PlanModel::trainable() const {
  int64_t n = replicated_trainable;
  for (const PlanUnit& unit : units) n += unit.trainable;
  return n;
}

absl::Status PlanOptions::Validate() const {
  auto bad = [](const char* flag, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", why));
  };
  if (world_size < 1) return bad("--world-size", absl::StrCat("must be >= 1, got ", world_size));
  if (IsHybrid(strategy) && shard_group_size != 0 &&
      (shard_group_size < 1 || world_size % shard_group_size != 0)) {
    return bad("--shard-group-size",
               absl::StrCat("must divide --world-size ", world_size, ", got ", shard_group_size));
  }
  if (dtype != at::kBFloat16 && dtype != at::kHalf && dtype != at::kFloat) {
    return bad("--dtype (worker.image_edit.torch_dtype)", "must be bfloat16, float16 or float32");
  }
  if (strategy == ShardingStrategy::kNoShard && (dtype != at::kFloat || cpu_offload)) {
    return bad("--strategy NO_SHARD (worker.image_edit.fsdp_sharding_strategy)",
               absl::StrCat("cannot go with ",
                            cpu_offload ? "--cpu-offload (worker.image_edit.fsdp_cpu_offload)"
                                        : absl::StrCat("--dtype ", DtypeName(dtype),
                                                       " (worker.image_edit.torch_dtype)"),
                            ": dray's FSDP keeps float32 masters and offloads only shards; "
                            "use FULL_SHARD or another strategy, or float32"));
  }
  if (limit_all_gathers < 1) {
    return bad("--limit-all-gathers", absl::StrCat("must be >= 1, got ", limit_all_gathers));
  }
  if (micro_batch < 1) {
    return bad("--micro-batch (worker.actor.micro_batch_size)",
               absl::StrCat("must be >= 1, got ", micro_batch));
  }
  if (height < 16 || width < 16 || height % 16 != 0 || width % 16 != 0) {
    return bad("--resolution (worker.rollout.resolution)",
               absl::StrCat("must be multiples of 16 (VAE 8 x patch 2), got ", height, "x", width));
  }
  if (condition_images < 0) return bad("--condition-images", "must be >= 0");
  if (text_tokens < 0) return bad("--text-tokens", "must be >= 0");
  if (allocator_overhead < 0 || allocator_overhead >= 1)
    return bad("--allocator-overhead", "must be in [0, 1)");
  if (context_bytes < 0) return bad("--context-memory", "must be >= 0");
  if (attention == AttentionKernel::kFused && libtorch == LibTorch::k1_13)
    return bad("--attention fused", "needs --libtorch 2: LibTorch 1.13 has only the blockwise one");
  return absl::OkStatus();
}

absl::StatusOr<MemoryPlan> PlanMemory(const PlanModel& model, const PlanOptions& options) {
  if (const absl::Status valid = options.Validate(); !valid.ok()) return valid;
  if (model.units.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(model.name, " has no blocks to shard"));
  }
  return Planner(model, options).Plan();
}

FitVerdict Verdict(const MemoryPlan& plan, int64_t device_bytes) {
  const MemoryTerm& largest =
      *std::max_element(plan.terms.begin(), plan.terms.end(),
                        [](const MemoryTerm& a, const MemoryTerm& b) { return a.bytes < b.bytes; });
  FitVerdict verdict;
  verdict.fits = plan.total <= device_bytes;
  verdict.dominant = largest.name;
  const std::string share = absl::StrFormat(
      "the largest term is %s, %s (%.0f%%: %s)", largest.name, FormatBytes(largest.bytes),
      100.0 * largest.bytes / std::max<int64_t>(1, plan.total), largest.detail);
  verdict.reason =
      verdict.fits
          ? absl::StrCat("fits: ", FormatBytes(plan.total), " of ", FormatBytes(device_bytes), ", ",
                         FormatBytes(device_bytes - plan.total), " to spare; ", share)
          : absl::StrCat("does not fit: ", FormatBytes(plan.total), " > ",
                         FormatBytes(device_bytes), " by ", FormatBytes(plan.total - device_bytes),
                         "; ", share);
  return verdict;
}

std::string FormatBytes(int64_t bytes) {
  const double gib = static_cast<double>(bytes) / (int64_t{1} << 30);
  return gib >= 0.1 ? absl::StrFormat("%.2f GiB", gib) : absl::StrFormat("%.1f MiB", gib * 1024);
}

}  // namespace dray
