#include "runtime/sharding/fully_sharded.h"

#include <ATen/ATen.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/shape_string.h"
#include "base/status_macros.h"
#include "runtime/sharding/fully_sharded_unit.h"
#include "runtime/sharding/tensor_storage.h"

namespace dray {

namespace {

// PostAccumulateHook runs a callback after a leaf's gradient was accumulated.
class PostAccumulateHook : public torch::autograd::FunctionPostHook {
 public:
  explicit PostAccumulateHook(std::function<void()> callback) : callback_(std::move(callback)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    callback_();
    return outputs;
  }

 private:
  std::function<void()> callback_;
};

}  // namespace

at::ScalarType MasterDtype(at::ScalarType dtype) {
  return dtype == at::kDouble ? at::kDouble : at::kFloat;
}

std::vector<std::vector<std::shared_ptr<torch::nn::Module>>> SizeBasedWrap(
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules, int64_t min_num_params) {
  std::vector<std::vector<std::shared_ptr<torch::nn::Module>>> units;
  int64_t in_last = min_num_params;  // start a new unit
  for (const auto& module : modules) {
    if (in_last >= min_num_params) {
      units.emplace_back();
      in_last = 0;
    }
    units.back().push_back(module);
    for (const auto& parameter : module->parameters()) in_last += parameter.numel();
  }
  return units;
}

FullyShardedModule::FullyShardedModule(std::shared_ptr<torch::nn::Module> root, Communicator* comm,
                                       ShardingOptions options)
    : root_(std::move(root)), comm_(comm), shard_comm_(comm), options_(options) {}

FullyShardedModule::~FullyShardedModule() = default;

void FullyShardedModule::Check(const absl::Status& status, const char* what) {
  // Inside forward and backward there is no status to return: fail the pass.
  if (!status.ok())
    throw std::runtime_error(absl::StrCat("sharding (", what, "): ", status.message()));
}

absl::StatusOr<std::unique_ptr<FullyShardedModule>> FullyShardedModule::Shard(
    std::shared_ptr<torch::nn::Module> root, std::vector<std::shared_ptr<torch::nn::Module>> units,
    Communicator* comm, ShardingOptions options) {
  std::vector<std::vector<std::shared_ptr<torch::nn::Module>>> groups;
  for (auto& unit : units) groups.push_back({std::move(unit)});
  return Shard(std::move(root), std::move(groups), comm, options);
}

absl::StatusOr<std::unique_ptr<FullyShardedModule>> FullyShardedModule::Shard(
    std::shared_ptr<torch::nn::Module> root,
    std::vector<std::vector<std::shared_ptr<torch::nn::Module>>> units, Communicator* comm,
    ShardingOptions options) {
  const MixedPrecision& precision = options.mixed_precision;
  if ((precision.param_dtype.has_value() || options.cpu_offload) &&
      options.strategy == ShardingStrategy::kNoShard) {
    return absl::UnimplementedError(
        "mixed precision and CPU offload need a sharding strategy, not NO_SHARD");
  }
  std::unique_ptr<FullyShardedModule> sharded(new FullyShardedModule(root, comm, options));
  const std::vector<at::Tensor> parameters = root->parameters();
  if (!parameters.empty()) sharded->master_dtype_ = MasterDtype(parameters[0].scalar_type());
  if (IsHybrid(options.strategy)) DRAY_RETURN_IF_ERROR(sharded->SplitHybridGroups());
  torch::NoGradGuard no_grad;
  std::map<const torch::nn::Module*, std::string> prefixes;
  for (const auto& named : root->named_modules()) prefixes[named.value().get()] = named.key();
  for (const auto& members : units) {
    std::vector<size_t> group;
    for (std::unique_ptr<Unit>& unit : sharded->Flatten(members, prefixes)) {
      DRAY_RETURN_IF_ERROR(sharded->ShardUnit(*unit));
      group.push_back(sharded->units_.size());
      sharded->units_.push_back(std::move(unit));
    }
    sharded->groups_.push_back(std::move(group));
  }
  DRAY_RETURN_IF_ERROR(sharded->ReplicateTheRest());
  sharded->reduce_dtype_ =
      precision.reduce_dtype.value_or(precision.param_dtype.value_or(sharded->master_dtype_));
  sharded->peak_parameter_bytes_ = sharded->LocalBytes().parameters;
  return sharded;
}

absl::Status FullyShardedModule::SplitHybridGroups() {
  const int size = options_.shard_group_size, world = comm_->world_size(), rank = comm_->rank();
  if (size < 1 || world % size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(ShardingStrategyName(options_.strategy),
                     " needs shard_group_size dividing the world size ", world, ", got ", size));
  }
  std::vector<int> shard_ranks, replica_ranks;
  for (int r = 0; r < size; ++r) shard_ranks.push_back(rank / size * size + r);
  for (int r = rank % size; r < world; r += size) replica_ranks.push_back(r);
  DRAY_ASSIGN_OR_RETURN(shard_group_, comm_->Subgroup(shard_ranks, "shard"));
  DRAY_ASSIGN_OR_RETURN(replica_group_, comm_->Subgroup(replica_ranks, "replica"));
  shard_comm_ = shard_group_.get();
  return absl::OkStatus();
}

std::vector<std::unique_ptr<FullyShardedModule::Unit>> FullyShardedModule::Flatten(
    const std::vector<std::shared_ptr<torch::nn::Module>>& members,
    const std::map<const torch::nn::Module*, std::string>& prefixes) {
  auto trainable = std::make_unique<Unit>();
  auto frozen = std::make_unique<Unit>();
  frozen->trainable = false;
  for (const auto& module : members) {
    group_of_hook_.push_back(groups_.size());
    auto found = prefixes.find(module.get());
    const std::string prefix = found == prefixes.end() ? "" : found->second;
    for (const auto& named : module->named_parameters()) {
      Unit& unit = named.value().requires_grad() ? *trainable : *frozen;
      unit.names.push_back(prefix.empty() ? named.key() : absl::StrCat(prefix, ".", named.key()));
      unit.params.push_back(named.value());
      unit.offsets.push_back(unit.padded);
      unit.padded += named.value().numel();  // the flat size so far; padded below
    }
  }
  const int64_t group = ShardsParameters(options_.strategy) ? shard_comm_->world_size() : 1;
  const bool has_frozen = !frozen->params.empty();
  std::vector<std::unique_ptr<Unit>> flats;
  if (!trainable->params.empty() || !has_frozen) flats.push_back(std::move(trainable));
  if (has_frozen) flats.push_back(std::move(frozen));
  for (auto& unit : flats) {
    unit->padded = (unit->padded + group - 1) / group * group;
    unit->free_after_gradients = !has_frozen;
  }
  return flats;
}

absl::Status FullyShardedModule::ShardUnit(Unit& unit) {
  const std::optional<at::ScalarType>& param_dtype = options_.mixed_precision.param_dtype;
  const at::TensorOptions options =
      unit.params.empty() ? at::TensorOptions() : unit.params[0].options();
  param_dtype_ =
      param_dtype.value_or(unit.params.empty() ? at::kFloat : unit.params[0].scalar_type());
  // The unit's parameters, concatenated and padded; rank 0's if synced.
  at::Tensor flat = at::zeros({unit.padded}, options);
  for (size_t i = 0; i < unit.params.size(); ++i) {
    if (!HasStorage(unit.params[i]))
      continue;  // built shape-only: filled by broadcast or LoadShards
    flat.slice(0, unit.offsets[i], unit.offsets[i] + unit.params[i].numel())
        .copy_(unit.params[i].reshape(-1));
  }
  if (options_.sync_module_states) DRAY_RETURN_IF_ERROR(comm_->Broadcast(flat, 0));
  // This rank's part: a master for the optimizer, or frozen as computed.
  const int64_t group = ShardsParameters(options_.strategy) ? shard_comm_->world_size() : 1;
  const int64_t shard_size = unit.padded / group;
  const int64_t rank = ShardsParameters(options_.strategy) ? shard_comm_->rank() : 0;
  const at::Device shard_device = options_.cpu_offload ? at::Device(at::kCPU) : flat.device();
  unit.shard = flat.slice(0, rank * shard_size, (rank + 1) * shard_size)
                   .to(shard_device, unit.trainable ? master_dtype_ : param_dtype_)
                   .clone()
                   .requires_grad_(unit.trainable);
  // NO_SHARD: the parameters view the master itself; otherwise a gathered buffer.
  unit.full = ShardsParameters(options_.strategy)
                  ? at::empty({unit.padded}, flat.options().dtype(param_dtype_))
                  : unit.shard.detach();
  RebindParameters(unit);
  unit.gathered = true;
  Free(unit);
  return absl::OkStatus();
}

void FullyShardedModule::RebindParameters(Unit& unit) {
  for (size_t i = 0; i < unit.params.size(); ++i) {
    at::Tensor& param = unit.params[i];
    // First the new data (its dtype may differ, which resets the gradient
    // accumulator), then the accumulator's hook.
    param.set_data(
        unit.full.slice(0, unit.offsets[i], unit.offsets[i] + param.numel()).view(param.sizes()));
    if (!unit.trainable) continue;  // a frozen parameter has no gradient accumulator
    auto accumulator = torch::autograd::impl::grad_accumulator(param);
    Unit* raw = &unit;
    accumulator->add_post_hook(
        std::make_unique<PostAccumulateHook>([this, raw] { OnParameterGradient(*raw); }));
    unit.accumulators.push_back(std::move(accumulator));
  }
}

absl::Status FullyShardedModule::ReplicateTheRest() {
  const MixedPrecision& precision = options_.mixed_precision;
  std::set<at::TensorImpl*> in_unit;
  for (const auto& unit : units_) {
    for (const at::Tensor& param : unit->params) in_unit.insert(param.unsafeGetTensorImpl());
  }
  for (const auto& named : root_->named_parameters()) {
    if (in_unit.count(named.value().unsafeGetTensorImpl())) continue;
    at::Tensor parameter = named.value();
    if (!HasStorage(parameter)) {  // shape-only: give it memory (filled by broadcast or LoadShards)
      AllocateStorage(parameter);
      parameter.detach().zero_();
    }
    if (options_.sync_module_states) {
      at::Tensor data = parameter.detach();
      DRAY_RETURN_IF_ERROR(comm_->Broadcast(data, 0));
    }
    replicated_.push_back(parameter);
    replicated_names_.push_back(named.key());
    if (precision.param_dtype.has_value() && parameter.requires_grad()) {
      // A master, and a working copy to compute with.
      replicated_masters_.push_back(parameter.detach().to(master_dtype_).clone().requires_grad_());
      parameter.set_data(parameter.detach().to(*precision.param_dtype));
    } else {  // its own master: frozen ones in the compute dtype, like frozen shards
      if (precision.param_dtype.has_value())
        parameter.set_data(parameter.detach().to(*precision.param_dtype));
      replicated_masters_.push_back(parameter);
    }
  }
  for (auto& buffer : root_->buffers()) {
    if (options_.sync_module_states) DRAY_RETURN_IF_ERROR(comm_->Broadcast(buffer, 0));
    if (precision.buffer_dtype.has_value()) buffer.set_data(buffer.to(*precision.buffer_dtype));
  }
  if (precision.param_dtype.has_value()) param_dtype_ = *precision.param_dtype;
  return absl::OkStatus();
}

absl::Status FullyShardedModule::Gather(Unit& unit) {
  if (unit.gathered) return absl::OkStatus();
  AllocateStorage(unit.full);
  unit.gathered = true;
  peak_parameter_bytes_ = std::max(peak_parameter_bytes_, LocalBytes().parameters);
  torch::NoGradGuard no_grad;
  DRAY_RETURN_IF_ERROR(shard_comm_->AllGather(
      unit.shard.detach().to(unit.full.device(), unit.full.scalar_type()), unit.full));
  return absl::OkStatus();
}

void FullyShardedModule::Free(Unit& unit) {
  if (!unit.gathered || !ShardsParameters(options_.strategy)) return;
  ReleaseStorage(unit.full);
  unit.gathered = false;
}

absl::Status FullyShardedModule::Offload() { return MoveMasters(at::kCPU); }

absl::Status FullyShardedModule::Load(at::Device device) { return MoveMasters(device); }

absl::Status FullyShardedModule::MoveMasters(at::Device device) {
  torch::NoGradGuard no_grad;
  for (auto& unit : units_) {
    if (unit->gathered && ShardsParameters(options_.strategy)) {
      return absl::FailedPreconditionError(
          "Offload/Load between forward and backward: a unit is still gathered");
    }
    // set_data keeps the tensors (and any optimizer holding them) the same.
    if (ShardsParameters(options_.strategy)) unit->shard.set_data(unit->shard.detach().to(device));
  }
  for (size_t i = 0; i < replicated_.size(); ++i) {
    replicated_[i].set_data(replicated_[i].detach().to(device));
    if (replicated_masters_[i].unsafeGetTensorImpl() != replicated_[i].unsafeGetTensorImpl()) {
      replicated_masters_[i].set_data(replicated_masters_[i].detach().to(device));
    }
  }
  return absl::OkStatus();
}

void FullyShardedModule::BeforeForward() {
  if (!options_.mixed_precision.param_dtype.has_value()) return;
  // Refresh the working copies whose masters moved (an optimizer step, a
  // load), found by value: torch::optim's SGD, for one, steps its
  // parameters' data without bumping their versions. An unchanged copy is
  // left as it is: one saved by an earlier forward (true CFG's first of two
  // before one backward) must keep its version for backward.
  torch::NoGradGuard no_grad;
  std::vector<size_t> own_master;
  std::vector<at::Tensor> rounded, moved;
  for (size_t i = 0; i < replicated_.size(); ++i) {
    if (replicated_masters_[i].unsafeGetTensorImpl() == replicated_[i].unsafeGetTensorImpl())
      continue;
    own_master.push_back(i);
    rounded.push_back(replicated_masters_[i].detach().to(replicated_[i].options()));
    moved.push_back(rounded.back().ne(replicated_[i].detach()).any());
  }
  if (own_master.empty()) return;
  const at::Tensor flags = at::stack(moved).cpu();  // one wait for the device, not one per copy
  for (size_t k = 0; k < own_master.size(); ++k) {
    if (flags.data_ptr<bool>()[k]) replicated_[own_master[k]].detach().copy_(rounded[k]);
  }
}

std::string FullyShardedModule::DescribePrecision() const {
  return absl::StrCat("trainable parameters stored as ", DtypeName(master_dtype_),
                      " shards, frozen ones in ", DtypeName(param_dtype_),
                      ", gathered and computed in ", DtypeName(param_dtype_),
                      ", gradients reduced in ", DtypeName(reduce_dtype_));
}

bool FullyShardedModule::Gathered(size_t group) const {
  for (size_t u : groups_[group]) {
    if (units_[u]->gathered && ShardsParameters(options_.strategy)) return true;
  }
  return false;
}

int FullyShardedModule::GatheredGroups() const {
  int gathered = 0;
  for (size_t group = 0; group < groups_.size(); ++group) gathered += Gathered(group) ? 1 : 0;
  return gathered;
}

void FullyShardedModule::GatherGroup(size_t group, const char* why) {
  for (size_t u : groups_[group]) Check(Gather(*units_[u]), why);
}

void FullyShardedModule::FreeGroup(size_t group) {
  for (size_t u : groups_[group]) Free(*units_[u]);
}

void FullyShardedModule::Prefetch(size_t group) {
  if (!options_.prefetch || group >= groups_.size() || Gathered(group)) return;
  if (GatheredGroups() >= options_.limit_all_gathers) return;
  GatherGroup(group, "prefetching a unit");
}

void FullyShardedModule::BeforeUnit(size_t hook) {
  const size_t group = group_of_hook_.at(hook);
  GatherGroup(group, "gathering a unit for forward");
  Prefetch(group + 1);
  if (hook == 0 || group_of_hook_[hook - 1] != group) {  // the unit's first module: a new pass
    for (size_t u : groups_[group]) {
      Unit& unit = *units_[u];
      unit.pending_gradients = 0;
      for (const at::Tensor& param : unit.params)
        unit.pending_gradients += param.requires_grad() ? 1 : 0;
      unit.gradients_reduced = !unit.trainable;
    }
  }
}

void FullyShardedModule::AfterUnit(size_t hook, const std::vector<at::Tensor>& outputs) {
  const size_t group = group_of_hook_.at(hook);
  bool backward_follows = false;
  for (const at::Tensor& output : outputs) {
    if (!output.defined() || !output.requires_grad()) continue;
    backward_follows = true;
    // Pre-backward: the unit's parameters are needed again when its output
    // gradients arrive.
    at::Tensor(output).register_hook([this, group](const at::Tensor& grad) {
      FinishLaterGroups(group);  // first, so that later units are freed before gathering
      GatherGroup(group, "gathering a unit for backward");
      if (group > 0) Prefetch(group - 1);
      if (!backward_callback_queued_) {
        backward_callback_queued_ = true;
        torch::autograd::Engine::get_default_engine().queue_callback([this] { FinishBackward(); });
      }
      return grad;
    });
  }
  const bool last_module = hook + 1 == group_of_hook_.size() || group_of_hook_[hook + 1] != group;
  if (last_module && (!backward_follows || ReshardsAfterForward(options_.strategy)))
    FreeGroup(group);
}

void FullyShardedModule::OnParameterGradient(Unit& unit) {
  if (--unit.pending_gradients > 0) return;
  if (gradient_sync_) Check(ReduceGradients(unit), "reducing gradients");
  if (unit.free_after_gradients) Free(unit);
}

absl::Status FullyShardedModule::ReduceGradients(Unit& unit) {
  torch::NoGradGuard no_grad;
  at::Tensor flat =
      at::zeros({unit.padded}, unit.full.options().dtype(reduce_dtype_));  // on the compute device
  for (size_t i = 0; i < unit.params.size(); ++i) {
    at::Tensor& grad = unit.params[i].mutable_grad();
    if (!grad.defined()) continue;
    flat.slice(0, unit.offsets[i], unit.offsets[i] + grad.numel()).copy_(grad.reshape(-1));
    grad.reset();
  }
  const int64_t world = comm_->world_size();
  at::Tensor reduced;
  if (ShardsParameters(options_.strategy)) {
    reduced = at::empty({unit.padded / shard_comm_->world_size()}, flat.options());
    DRAY_RETURN_IF_ERROR(shard_comm_->ReduceScatter(flat, reduced));
    if (replica_group_ != nullptr) DRAY_RETURN_IF_ERROR(replica_group_->AllReduce(reduced));
  } else {
    DRAY_RETURN_IF_ERROR(comm_->AllReduce(flat));
    reduced = flat;
  }
  reduced = reduced.to(unit.shard.device(), master_dtype_)
                .div_(world);  // to the master's device (CPU when offloaded)
  at::Tensor& grad = unit.shard.mutable_grad();
  grad = grad.defined() ? grad.add_(reduced) : reduced;
  unit.gradients_reduced = true;
  return absl::OkStatus();
}

bool FullyShardedModule::HasGradients(const Unit& unit) {
  for (const at::Tensor& param : unit.params) {
    if (param.grad().defined()) return true;
  }
  return false;
}

void FullyShardedModule::FinishLaterGroups(size_t group) {
  // Units run in index order, so backward reaches them in reverse: when unit
  // `group` starts its backward, every later unit has finished its own, even
  // if some of its parameters got no gradient (and so no post-hook fired).
  // When several graphs share the units (two forwards, one backward: true
  // CFG), their backward passes interleave and a later unit may get its
  // gradients only after this: it is reduced then, or at FinishBackward.
  for (size_t later = group + 1; later < groups_.size(); ++later) {
    for (size_t u : groups_[later]) {
      Unit& unit = *units_[u];
      if (!unit.gradients_reduced && HasGradients(unit)) {
        if (gradient_sync_) Check(ReduceGradients(unit), "reducing gradients");
        unit.gradients_reduced = true;
      }
      Free(unit);
    }
  }
}

void FullyShardedModule::FinishBackward() {
  backward_callback_queued_ = false;
  // Units whose parameters did not all receive gradients (unused ones), and
  // gradients that arrived after their unit was first reduced.
  for (auto& unit : units_) {
    if (gradient_sync_ && unit->trainable && (!unit->gradients_reduced || HasGradients(*unit)))
      Check(ReduceGradients(*unit), "reducing gradients");
    Free(*unit);
  }
  if (!gradient_sync_) return;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < replicated_.size(); ++i) {
    if (!replicated_[i].requires_grad()) continue;  // frozen
    at::Tensor& grad = replicated_[i].mutable_grad();
    at::Tensor reduced = grad.defined() ? grad.to(reduce_dtype_)
                                        : at::zeros(replicated_[i].sizes(),
                                                    replicated_[i].options().dtype(reduce_dtype_));
    Check(comm_->AllReduce(reduced), "all-reducing replicated gradients");
    reduced = reduced.to(master_dtype_).div_(comm_->world_size());
    if (replicated_masters_[i].unsafeGetTensorImpl() == replicated_[i].unsafeGetTensorImpl()) {
      grad = reduced;  // no mixed precision: the parameter is its own master
    } else {
      grad.reset();
      at::Tensor& master_grad = replicated_masters_[i].mutable_grad();
      master_grad = master_grad.defined() ? master_grad.add_(reduced) : reduced;
    }
  }
}

std::vector<at::Tensor> FullyShardedModule::shards() const {
  std::vector<at::Tensor> tensors;
  for (const auto& unit : units_) {
    if (unit->trainable) tensors.push_back(unit->shard);
  }
  for (const at::Tensor& master : replicated_masters_) {
    if (master.requires_grad()) tensors.push_back(master);
  }
  return tensors;
}

absl::StatusOr<double> FullyShardedModule::ClipGradNorm(double max_norm) {
  torch::NoGradGuard no_grad;
  // Sums on the compute device (NCCL reduces device tensors), in float64.
  const at::TensorOptions sum_options =
      (units_.empty() ? at::TensorOptions() : units_[0]->full.options()).dtype(at::kDouble);
  at::Tensor sharded_sum = at::zeros({1}, sum_options);
  at::Tensor replicated_sum = at::zeros({1}, sum_options);
  for (const auto& unit : units_) {
    if (unit->shard.grad().defined())
      sharded_sum += unit->shard.grad().to(sum_options).pow(2).sum();
  }
  for (const at::Tensor& master : replicated_masters_) {
    if (master.grad().defined()) replicated_sum += master.grad().to(sum_options).pow(2).sum();
  }
  // Shards are disjoint across ranks (sum them); replicas are the same everywhere.
  if (ShardsParameters(options_.strategy))
    DRAY_RETURN_IF_ERROR(shard_comm_->AllReduce(sharded_sum));
  const double norm = std::sqrt((sharded_sum + replicated_sum).item<double>());
  if (norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    for (const at::Tensor& tensor : shards()) {
      if (tensor.grad().defined()) tensor.grad().mul_(scale);
    }
  }
  return norm;
}

int64_t FullyShardedModule::LargestUnitBytes() const {
  int64_t largest = 0;
  for (const auto& unit : units_)
    largest = std::max<int64_t>(largest, unit->padded * unit->full.element_size());
  return largest;
}

FullyShardedModule::Bytes FullyShardedModule::LocalBytes() const {
  Bytes bytes;
  for (const auto& unit : units_) {
    bytes.parameters +=
        unit->shard.nbytes() +
        (unit->gathered && ShardsParameters(options_.strategy) ? unit->full.nbytes() : 0);
    if (unit->shard.grad().defined()) bytes.gradients += unit->shard.grad().nbytes();
    for (const at::Tensor& param : unit->params) {
      if (param.grad().defined()) bytes.gradients += param.grad().nbytes();
    }
  }
  for (size_t i = 0; i < replicated_.size(); ++i) {
    const bool own_master =
        replicated_masters_[i].unsafeGetTensorImpl() == replicated_[i].unsafeGetTensorImpl();
    bytes.parameters +=
        replicated_[i].nbytes() + (own_master ? 0 : replicated_masters_[i].nbytes());
    if (replicated_[i].grad().defined()) bytes.gradients += replicated_[i].grad().nbytes();
    if (!own_master && replicated_masters_[i].grad().defined())
      bytes.gradients += replicated_masters_[i].grad().nbytes();
  }
  return bytes;
}

}  // namespace dray
