// FullyShardedModule: PyTorch FSDP's design for LibTorch modules.
//
// Each unit (a submodule: a transformer block, a ResNet block) has its
// parameters flattened into one flat parameter, padded to a multiple of the
// world size; each rank keeps 1/W of it, in float32 (float64 for a float64
// module), as the optimizer's master copy. A unit's parameters exist in full only while it runs:
//
//   forward:   all-gather before the unit, free after it (FULL_SHARD; kept
//              until backward with SHARD_GRAD_OP)
//   backward:  all-gather again when the unit's output gradients arrive;
//              once its parameter gradients are accumulated, reduce-scatter
//              them (averaged over ranks) into the shards' .grad, and free
//
// The model stays single-device code: it calls UnitHooks around each unit.
// Parameters outside every unit are replicated (their gradients all-reduced).
//
// Parameters frozen before sharding (requires_grad false: a base model under
// LoRA, FSDP's use_orig_params with frozen parameters) are flattened apart
// from the trainable ones of their unit: their shards stay in the compute
// dtype, get no gradients, are never reduced, and the optimizer never sees
// them, so weight decay cannot move them.
//
//   DRAY_ASSIGN_OR_RETURN(auto sharded, FullyShardedModule::Shard(
//                                           model.ptr(), UnitsOfType<BlockImpl>(*model), comm,
//                                           {ShardingStrategy::kFullShard}));
//   model->set_unit_hooks(sharded.get());
//   torch::optim::AdamW optimizer(sharded->shards(), ...);
//   loss = ...model->forward(x)...; loss.backward(); optimizer.step();
//
// Every rank must run the same units in the same order (collectives), and
// units run in index order, one after another (blocks of a transformer).
//
// Thread-safety: not thread-safe; one training thread per rank.
#ifndef DRAY_RUNTIME_SHARDING_FULLY_SHARDED_H_
#define DRAY_RUNTIME_SHARDING_FULLY_SHARDED_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/collectives/communicator.h"
#include "runtime/io/safetensors.h"
#include "runtime/sharding/strategy.h"
#include "runtime/sharding/unit_hooks.h"

namespace dray {

// MixedPrecision: the dtypes parameters take outside their master shards
// (FSDP's MixedPrecision). Unset fields keep the parameters' dtype.
struct MixedPrecision {
  std::optional<at::ScalarType> param_dtype;   // gathered parameters: the compute dtype
  std::optional<at::ScalarType> reduce_dtype;  // gradient reduction (default: param_dtype,
                                               // else the masters' dtype)
  std::optional<at::ScalarType> buffer_dtype;  // module buffers
};

struct ShardingOptions {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  // Broadcast rank 0's parameters before sharding (FSDP's
  // sync_module_states), for ranks that did not build identical modules.
  bool sync_module_states = false;
  // HYBRID_SHARD and HYBRID_SHARD_ZERO2: ranks per shard group (e.g. the
  // GPUs of a node); groups are contiguous ranks, replicas of each other.
  int shard_group_size = 0;
  // Gather the next unit (in forward) or the previous one (in backward)
  // ahead of its use, holding at most `limit_all_gathers` units at once.
  bool prefetch = false;
  int limit_all_gathers = 2;
  MixedPrecision mixed_precision;
  // Keep the master shards, their gradients and so the optimizer's
  // state in CPU memory; units move to the compute device only to run.
  bool cpu_offload = false;
};

// MasterDtype: the dtype a module whose parameters are `dtype` keeps its
// trainable masters in: float32, or float64 for a float64 module (runs
// checked at float64's precision, where reduction order is invisible).
at::ScalarType MasterDtype(at::ScalarType dtype);

// UnitsOfType returns the submodules of `root` of type T (in registration
// order): FSDP's TRANSFORMER_BASED_WRAP, e.g. UnitsOfType<TransformerBlockImpl>.
template <typename T>
std::vector<std::shared_ptr<torch::nn::Module>> UnitsOfType(const torch::nn::Module& root) {
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  for (const auto& module : root.modules(/*include_self=*/false)) {
    if (module->as<T>() != nullptr) units.push_back(module);
  }
  return units;
}

// SizeBasedWrap groups consecutive `modules` into units of at least
// `min_num_params` parameters each (the last may be smaller): FSDP's
// SIZE_BASED_WRAP over the modules a model calls hooks around.
std::vector<std::vector<std::shared_ptr<torch::nn::Module>>> SizeBasedWrap(
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules, int64_t min_num_params);

class FullyShardedModule : public UnitHooks {
 public:
  // Shard takes over the parameters of `units` (submodules of `root`); the
  // other parameters of `root` stay replicated. Every rank calls it; `comm`
  // must outlive the returned module.
  static absl::StatusOr<std::unique_ptr<FullyShardedModule>> Shard(
      std::shared_ptr<torch::nn::Module> root,
      std::vector<std::shared_ptr<torch::nn::Module>> units, Communicator* comm,
      ShardingOptions options = {});

  // Shard with units of several consecutive modules each (SizeBasedWrap):
  // the model's hook index i is the i-th module overall; a unit is gathered
  // at its first module and freed after its last.
  static absl::StatusOr<std::unique_ptr<FullyShardedModule>> Shard(
      std::shared_ptr<torch::nn::Module> root,
      std::vector<std::vector<std::shared_ptr<torch::nn::Module>>> units, Communicator* comm,
      ShardingOptions options = {});

  ~FullyShardedModule() override;

  void BeforeForward() override;
  void BeforeUnit(size_t index) override;
  void AfterUnit(size_t index, const std::vector<at::Tensor>& outputs) override;

  // shards returns the tensors an optimizer updates, all masters:
  // every unit's local shard of trainable parameters, then the trainable
  // replicated parameters (themselves, or under mixed precision their
  // masters). Their .grad is set by backward.
  std::vector<at::Tensor> shards() const;

  // DescribePrecision says which dtype is stored, gathered and reduced.
  std::string DescribePrecision() const;

  // Offload moves the master shards and replicated parameters to CPU memory
  // (an inference worker between calls: verl's offload_fsdp_model); Load
  // brings them back to `device` (load_fsdp_model). Call them outside
  // forward/backward. Tensors keep their identity, so optimizers stay valid.
  absl::Status Offload();
  absl::Status Load(at::Device device);

  // set_gradient_sync(false) lets backward accumulate full gradients locally
  // without communication (gradient accumulation); the next backward with
  // sync on reduces everything accumulated.
  void set_gradient_sync(bool sync) { gradient_sync_ = sync; }

  // ClipGradNorm scales all gradients so that their global L2 norm (over
  // every rank's shards) is at most `max_norm`; returns the norm before.
  absl::StatusOr<double> ClipGradNorm(double max_norm);

  // FullParameters gathers every parameter under its original name, in
  // the masters' dtype (all ranks must call it); for checks and FULL state dicts.
  absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> FullParameters();

  // LoadShards fills this rank's shards (and the replicated parameters)
  // from a checkpoint that names parameters as the module does: each rank
  // reads only the slices it keeps. A missing tensor or a wrong shape is an
  // error naming it. Replicated parameters named in `kept` are not read:
  // they keep the values they were sharded with (a part the checkpoint
  // predates, e.g. a head added to a pretrained model).
  absl::Status LoadShards(const Checkpoint& checkpoint, const std::set<std::string>& kept = {});

  // State dicts. FULL: every parameter gathered under its name, written by
  // rank 0 as one safetensors file (all ranks call it). SHARDED: each rank
  // writes its shards and the layout to `dir`/shard-RRRRR-of-WWWWW.safetensors;
  // LoadShardedStateDict reads a directory written at any world size.
  absl::Status SaveFullStateDict(const std::string& path);
  // LOCAL: this rank's flat shards as they are ("unit0", "unit1", ...), and
  // the replicated parameters; loadable only with the same units and world.
  std::vector<std::pair<std::string, at::Tensor>> LocalStateDict() const;
  absl::Status LoadLocalStateDict(const std::vector<std::pair<std::string, at::Tensor>>& state);
  absl::Status SaveShardedStateDict(const std::string& dir);
  absl::Status LoadShardedStateDict(const std::string& dir);
  // Training checkpoints: tensors laid out like shards() (the masters
  // themselves, or an optimizer's state of each), every rank writing the
  // part it keeps to `dir`/NAME-RRRRR-of-WWWWW.safetensors as SHARDED does
  // (all ranks call it); loading reads a directory written at any world size.
  absl::Status SaveShardedLike(const std::string& dir, const std::string& name,
                               const std::vector<at::Tensor>& like_shards);
  absl::Status LoadShardedLike(const std::string& dir, const std::string& name,
                               const std::vector<at::Tensor>& like_shards);

  // LocalBytes reports this rank's resident parameter and gradient bytes.
  struct Bytes {
    int64_t parameters = 0;  // shards + replicated + currently gathered units
    int64_t gradients = 0;
  };
  Bytes LocalBytes() const;

  // PeakParameterBytes: the most parameter bytes this rank has held at once
  // since sharding (shards, replicated and gathered units).
  int64_t PeakParameterBytes() const { return peak_parameter_bytes_; }

  // LargestUnitBytes: the size of the largest unit when gathered.
  int64_t LargestUnitBytes() const;

 private:
  struct Unit;
  FullyShardedModule(std::shared_ptr<torch::nn::Module> root, Communicator* comm,
                     ShardingOptions options);

  // ShardSlot: a tensor laid out like a unit's shard (unit set) or like a
  // replicated parameter, saved under `key` in sharded state dicts.
  struct ShardSlot {
    const Unit* unit;
    std::string key;
    at::Tensor tensor;
  };
  // AllSlots: every unit's shard, then every replicated master.
  std::vector<ShardSlot> AllSlots() const;
  // SlotsLikeShards: the trainable slots (shards()'s order), holding `like_shards`.
  absl::StatusOr<std::vector<ShardSlot>> SlotsLikeShards(
      const std::vector<at::Tensor>& like_shards) const;
  absl::Status WriteSlots(const std::string& dir, const std::string& prefix,
                          const std::vector<ShardSlot>& slots);
  absl::Status ReadSlots(const std::string& dir, const std::string& prefix,
                         const std::vector<ShardSlot>& slots);

  // The steps of Shard, in order. SplitHybridGroups makes the shard and
  // replica groups of a hybrid strategy.
  absl::Status SplitHybridGroups();
  // Flatten lays the parameters of `members` out as flat parameters (no
  // memory yet): the trainable ones, then the frozen ones, if any.
  std::vector<std::unique_ptr<Unit>> Flatten(
      const std::vector<std::shared_ptr<torch::nn::Module>>& members,
      const std::map<const torch::nn::Module*, std::string>& prefixes);
  // ShardUnit fills the unit's flat parameter (rank 0's, when synced), keeps
  // this rank's master shard, and frees the rest.
  absl::Status ShardUnit(Unit& unit);
  // RebindParameters makes the unit's parameters views of its flat buffer and
  // hooks their gradient accumulation.
  void RebindParameters(Unit& unit);
  // ReplicateTheRest keeps parameters outside every unit whole on each rank,
  // with masters under mixed precision, and syncs the buffers.
  absl::Status ReplicateTheRest();

  // ShardRange returns [begin, end) of this rank's shard within a unit's flat parameter.
  std::pair<int64_t, int64_t> ShardRange(const Unit& unit) const;
  absl::Status Gather(Unit& unit);
  absl::Status MoveMasters(at::Device device);
  // A group: the flat parameters of one unit of modules, gathered and freed together.
  void GatherGroup(size_t group, const char* why);
  void FreeGroup(size_t group);
  bool Gathered(size_t group) const;
  int GatheredGroups() const;
  // Prefetch gathers group `group` if it exists and the limit allows.
  void Prefetch(size_t group);
  void Free(Unit& unit);
  absl::Status ReduceGradients(Unit& unit);
  void OnParameterGradient(Unit& unit);
  void FinishLaterGroups(size_t group);
  // HasGradients: whether any parameter of `unit` holds a gradient not yet reduced.
  static bool HasGradients(const Unit& unit);
  void FinishBackward();
  void Check(const absl::Status& status, const char* what);

  std::shared_ptr<torch::nn::Module> root_;
  Communicator* comm_;                           // every rank
  std::unique_ptr<Communicator> shard_group_;    // hybrid: this rank's shard group
  std::unique_ptr<Communicator> replica_group_;  // hybrid: its replicas in other groups
  Communicator* shard_comm_;                     // where units are gathered and reduce-scattered
  ShardingOptions options_;
  std::vector<std::unique_ptr<Unit>> units_;  // flat parameters
  std::vector<std::vector<size_t>> groups_;   // unit of modules -> its flat parameters
  std::vector<size_t> group_of_hook_;         // model hook index -> unit of modules
  std::vector<at::Tensor> replicated_;        // parameters outside every unit
  std::vector<std::string> replicated_names_;
  std::vector<at::Tensor>
      replicated_masters_;  // masters (the parameters themselves without mixed precision)
  at::ScalarType master_dtype_ = at::kFloat;  // MasterDtype of the module's parameters
  at::ScalarType param_dtype_ = at::kFloat;
  at::ScalarType reduce_dtype_ = at::kFloat;
  bool gradient_sync_ = true;
  bool backward_callback_queued_ = false;
  int64_t peak_parameter_bytes_ = 0;
};

}  // namespace dray

#endif  // DRAY_RUNTIME_SHARDING_FULLY_SHARDED_H_
