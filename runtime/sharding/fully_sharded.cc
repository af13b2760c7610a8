#include "runtime/sharding/fully_sharded.h"

#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <stdexcept>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "dispatch/status_macros.h"
#include "runtime/tensor_storage.h"

namespace dray {

// Unit: one flat parameter. Its module parameters are views into `full`,
// whose storage is allocated only while the unit is gathered, so that views
// autograd saved for backward stay valid across a free and a re-gather.
struct FullyShardedModule::Unit {
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  std::vector<int64_t> offsets;
  int64_t padded = 0;        // flat size, a multiple of the shard group
  at::Tensor shard;          // float32 master of this rank's part, for the optimizer
  at::Tensor full;           // [padded], storage freed while resharded
  bool gathered = false;
  int pending_gradients = 0;  // parameters still to accumulate in this backward
  bool gradients_reduced = true;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // keep post-hooks alive
};

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

bool Shards(ShardingStrategy strategy) { return strategy != ShardingStrategy::kNoShard; }

bool Hybrid(ShardingStrategy strategy) {
  return strategy == ShardingStrategy::kHybridShard || strategy == ShardingStrategy::kHybridShardZero2;
}

// ReshardsAfterForward: FULL_SHARD frees units after forward, ZERO2-like
// strategies keep them until backward.
bool ReshardsAfterForward(ShardingStrategy strategy) {
  return strategy == ShardingStrategy::kFullShard || strategy == ShardingStrategy::kHybridShard;
}

}  // namespace

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
  if (!status.ok()) throw std::runtime_error(absl::StrCat("sharding (", what, "): ", status.message()));
}

absl::StatusOr<std::unique_ptr<FullyShardedModule>> FullyShardedModule::Shard(
    std::shared_ptr<torch::nn::Module> root, std::vector<std::shared_ptr<torch::nn::Module>> units,
    Communicator* comm, ShardingOptions options) {
  std::vector<std::vector<std::shared_ptr<torch::nn::Module>>> groups;
  for (auto& unit : units) groups.push_back({std::move(unit)});
  return Shard(std::move(root), std::move(groups), comm, options);
}

absl::StatusOr<std::unique_ptr<FullyShardedModule>> FullyShardedModule::Shard(
    std::shared_ptr<torch::nn::Module> root, std::vector<std::vector<std::shared_ptr<torch::nn::Module>>> units,
    Communicator* comm, ShardingOptions options) {
  std::unique_ptr<FullyShardedModule> sharded(new FullyShardedModule(root, comm, options));
  const MixedPrecision& precision = options.mixed_precision;
  if ((precision.param_dtype.has_value() || options.cpu_offload) && options.strategy == ShardingStrategy::kNoShard) {
    return absl::UnimplementedError("mixed precision and CPU offload need a sharding strategy, not NO_SHARD");
  }
  if (Hybrid(options.strategy)) {
    const int size = options.shard_group_size, world = comm->world_size();
    if (size < 1 || world % size != 0) {
      return absl::InvalidArgumentError(absl::StrCat(ShardingStrategyName(options.strategy),
                                                     " needs shard_group_size dividing the world size ", world,
                                                     ", got ", size));
    }
    std::vector<int> shard_ranks, replica_ranks;
    for (int r = 0; r < size; ++r) shard_ranks.push_back(comm->rank() / size * size + r);
    for (int r = comm->rank() % size; r < world; r += size) replica_ranks.push_back(r);
    DRAY_ASSIGN_OR_RETURN(sharded->shard_group_, comm->Subgroup(shard_ranks, "shard"));
    DRAY_ASSIGN_OR_RETURN(sharded->replica_group_, comm->Subgroup(replica_ranks, "replica"));
    sharded->shard_comm_ = sharded->shard_group_.get();
  }
  torch::NoGradGuard no_grad;
  std::map<const torch::nn::Module*, std::string> prefixes;
  for (const auto& named : root->named_modules()) prefixes[named.value().get()] = named.key();
  std::map<at::TensorImpl*, bool> in_unit;
  const int64_t group = Shards(options.strategy) ? sharded->shard_comm_->world_size() : 1;
  for (const auto& members : units) {
    auto unit = std::make_unique<Unit>();
    int64_t numel = 0;
    for (const auto& module : members) {
      sharded->unit_of_hook_.push_back(sharded->units_.size());
      const std::string prefix = prefixes.count(module.get()) ? prefixes[module.get()] : "";
      for (const auto& named : module->named_parameters()) {
        unit->names.push_back(prefix.empty() ? named.key() : absl::StrCat(prefix, ".", named.key()));
        unit->params.push_back(named.value());
        unit->offsets.push_back(numel);
        numel += named.value().numel();
        in_unit[named.value().unsafeGetTensorImpl()] = true;
      }
    }
    unit->padded = (numel + group - 1) / group * group;
    const at::ScalarType dtype = precision.param_dtype.value_or(unit->params.empty() ? at::kFloat : unit->params[0].scalar_type());
    sharded->param_dtype_ = dtype;
    at::Tensor flat = at::zeros({unit->padded}, unit->params.empty() ? at::TensorOptions() : unit->params[0].options());
    for (size_t i = 0; i < unit->params.size(); ++i) {
      if (!HasStorage(unit->params[i])) continue;  // built shape-only: filled by broadcast or LoadShards
      flat.slice(0, unit->offsets[i], unit->offsets[i] + unit->params[i].numel()).copy_(unit->params[i].reshape(-1));
    }
    if (options.sync_module_states) DRAY_RETURN_IF_ERROR(comm->Broadcast(flat, 0));
    const int64_t shard_size = unit->padded / group;
    const int64_t rank = Shards(options.strategy) ? sharded->shard_comm_->rank() : 0;
    const at::Device shard_device = options.cpu_offload ? at::Device(at::kCPU) : flat.device();
    unit->shard = flat.slice(0, rank * shard_size, (rank + 1) * shard_size).to(shard_device, at::kFloat).clone().requires_grad_(true);
    // NO_SHARD: the parameters view the master itself; otherwise a gathered buffer.
    unit->full = Shards(options.strategy) ? at::empty({unit->padded}, flat.options().dtype(dtype)) : unit->shard.detach();
    for (size_t i = 0; i < unit->params.size(); ++i) {
      at::Tensor& param = unit->params[i];
      // First the new data (its dtype may differ, which resets the gradient
      // accumulator), then the accumulator's hook.
      param.set_data(unit->full.slice(0, unit->offsets[i], unit->offsets[i] + param.numel()).view(param.sizes()));
      auto accumulator = torch::autograd::impl::grad_accumulator(param);
      Unit* raw = unit.get();
      FullyShardedModule* self = sharded.get();
      accumulator->add_post_hook(std::make_unique<PostAccumulateHook>([self, raw] { self->OnParameterGradient(*raw); }));
      unit->accumulators.push_back(std::move(accumulator));
    }
    unit->gathered = true;
    sharded->Free(*unit);
    sharded->units_.push_back(std::move(unit));
  }
  for (const auto& named : root->named_parameters()) {
    if (in_unit.count(named.value().unsafeGetTensorImpl())) continue;
    at::Tensor parameter = named.value();
    if (!HasStorage(parameter)) {  // shape-only: give it memory (filled by broadcast or LoadShards)
      AllocateStorage(parameter);
      parameter.detach().zero_();
    }
    if (options.sync_module_states) {
      at::Tensor data = parameter.detach();
      DRAY_RETURN_IF_ERROR(comm->Broadcast(data, 0));
    }
    sharded->replicated_.push_back(parameter);
    sharded->replicated_names_.push_back(named.key());
    if (precision.param_dtype.has_value()) {  // a float32 master, and a working copy to compute with
      sharded->replicated_masters_.push_back(parameter.detach().to(at::kFloat).clone().requires_grad_(true));
      parameter.set_data(parameter.detach().to(*precision.param_dtype));
    } else {
      sharded->replicated_masters_.push_back(parameter);
    }
  }
  for (auto& buffer : root->buffers()) {
    if (options.sync_module_states) DRAY_RETURN_IF_ERROR(comm->Broadcast(buffer, 0));
    if (precision.buffer_dtype.has_value()) buffer.set_data(buffer.to(*precision.buffer_dtype));
  }
  if (precision.param_dtype.has_value()) sharded->param_dtype_ = *precision.param_dtype;
  sharded->reduce_dtype_ = precision.reduce_dtype.value_or(precision.param_dtype.value_or(at::kFloat));
  sharded->peak_parameter_bytes_ = sharded->LocalBytes().parameters;
  return sharded;
}

absl::Status FullyShardedModule::Gather(Unit& unit) {
  if (unit.gathered) return absl::OkStatus();
  AllocateStorage(unit.full);
  unit.gathered = true;
  peak_parameter_bytes_ = std::max(peak_parameter_bytes_, LocalBytes().parameters);
  torch::NoGradGuard no_grad;
  DRAY_RETURN_IF_ERROR(shard_comm_->AllGather(unit.shard.detach().to(unit.full.device(), unit.full.scalar_type()), unit.full));
  return absl::OkStatus();
}

void FullyShardedModule::Free(Unit& unit) {
  if (!unit.gathered || !Shards(options_.strategy)) return;
  ReleaseStorage(unit.full);
  unit.gathered = false;
}

absl::Status FullyShardedModule::Offload() {
  return MoveMasters(at::kCPU);
}

absl::Status FullyShardedModule::Load(at::Device device) {
  return MoveMasters(device);
}

absl::Status FullyShardedModule::MoveMasters(at::Device device) {
  torch::NoGradGuard no_grad;
  for (auto& unit : units_) {
    if (unit->gathered && Shards(options_.strategy)) {
      return absl::FailedPreconditionError("Offload/Load between forward and backward: a unit is still gathered");
    }
    // set_data keeps the tensors (and any optimizer holding them) the same.
    if (Shards(options_.strategy)) unit->shard.set_data(unit->shard.detach().to(device));
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
  torch::NoGradGuard no_grad;  // refresh the working copies from their masters (after optimizer steps)
  for (size_t i = 0; i < replicated_.size(); ++i) replicated_[i].detach().copy_(replicated_masters_[i]);
}

std::string FullyShardedModule::DescribePrecision() const {
  return absl::StrCat("parameters stored as float32 shards, gathered and computed in ", c10::toString(param_dtype_),
                      ", gradients reduced in ", c10::toString(reduce_dtype_));
}

int FullyShardedModule::GatheredUnits() const {
  int gathered = 0;
  for (const auto& unit : units_) gathered += unit->gathered && Shards(options_.strategy) ? 1 : 0;
  return gathered;
}

void FullyShardedModule::Prefetch(size_t index) {
  if (!options_.prefetch || index >= units_.size() || units_[index]->gathered) return;
  if (GatheredUnits() >= options_.limit_all_gathers) return;
  Check(Gather(*units_[index]), "prefetching a unit");
}

void FullyShardedModule::BeforeUnit(size_t hook) {
  const size_t index = unit_of_hook_.at(hook);
  Unit& unit = *units_[index];
  Check(Gather(unit), "gathering a unit for forward");
  Prefetch(index + 1);
  if (hook == 0 || unit_of_hook_[hook - 1] != index) {  // the unit's first module: a new pass
    unit.pending_gradients = 0;
    for (const at::Tensor& param : unit.params) unit.pending_gradients += param.requires_grad() ? 1 : 0;
    unit.gradients_reduced = false;
  }
}

void FullyShardedModule::AfterUnit(size_t hook, const std::vector<at::Tensor>& outputs) {
  const size_t index = unit_of_hook_.at(hook);
  Unit& unit = *units_[index];
  bool backward_follows = false;
  for (const at::Tensor& output : outputs) {
    if (!output.defined() || !output.requires_grad()) continue;
    backward_follows = true;
    // Pre-backward: the unit's parameters are needed again when its output
    // gradients arrive.
    at::Tensor(output).register_hook([this, &unit, index](const at::Tensor& grad) {
      FinishLaterUnits(index);  // first, so that later units are freed before gathering
      Check(Gather(unit), "gathering a unit for backward");
      if (index > 0) Prefetch(index - 1);
      if (!backward_callback_queued_) {
        backward_callback_queued_ = true;
        torch::autograd::Engine::get_default_engine().queue_callback([this] { FinishBackward(); });
      }
      return grad;
    });
  }
  const bool last_module = hook + 1 == unit_of_hook_.size() || unit_of_hook_[hook + 1] != index;
  if (last_module && (!backward_follows || ReshardsAfterForward(options_.strategy))) Free(unit);
}

void FullyShardedModule::OnParameterGradient(Unit& unit) {
  if (--unit.pending_gradients > 0) return;
  if (gradient_sync_) Check(ReduceGradients(unit), "reducing gradients");
  Free(unit);
}

absl::Status FullyShardedModule::ReduceGradients(Unit& unit) {
  torch::NoGradGuard no_grad;
  at::Tensor flat = at::zeros({unit.padded}, unit.full.options().dtype(reduce_dtype_));  // on the compute device
  for (size_t i = 0; i < unit.params.size(); ++i) {
    at::Tensor& grad = unit.params[i].mutable_grad();
    if (!grad.defined()) continue;
    flat.slice(0, unit.offsets[i], unit.offsets[i] + grad.numel()).copy_(grad.reshape(-1));
    grad.reset();
  }
  const int64_t world = comm_->world_size();
  at::Tensor reduced;
  if (Shards(options_.strategy)) {
    reduced = at::empty({unit.padded / shard_comm_->world_size()}, flat.options());
    DRAY_RETURN_IF_ERROR(shard_comm_->ReduceScatter(flat, reduced));
    if (replica_group_ != nullptr) DRAY_RETURN_IF_ERROR(replica_group_->AllReduce(reduced));
  } else {
    DRAY_RETURN_IF_ERROR(comm_->AllReduce(flat));
    reduced = flat;
  }
  reduced = reduced.to(unit.shard.device(), at::kFloat).div_(world);  // to the master's device (CPU when offloaded)
  at::Tensor& grad = unit.shard.mutable_grad();
  grad = grad.defined() ? grad.add_(reduced) : reduced;
  unit.gradients_reduced = true;
  return absl::OkStatus();
}

void FullyShardedModule::FinishLaterUnits(size_t index) {
  // Units run in index order, so backward reaches them in reverse: when unit
  // `index` starts its backward, every later unit has finished its own, even
  // if some of its parameters got no gradient (and so no post-hook fired).
  for (size_t later = index + 1; later < units_.size(); ++later) {
    Unit& unit = *units_[later];
    if (unit.gradients_reduced) continue;
    if (gradient_sync_) Check(ReduceGradients(unit), "reducing gradients");
    unit.gradients_reduced = true;
    Free(unit);
  }
}

void FullyShardedModule::FinishBackward() {
  backward_callback_queued_ = false;
  // Units whose parameters did not all receive gradients (unused ones).
  for (auto& unit : units_) {
    if (gradient_sync_ && !unit->gradients_reduced) Check(ReduceGradients(*unit), "reducing gradients");
    Free(*unit);
  }
  if (!gradient_sync_) return;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < replicated_.size(); ++i) {
    at::Tensor& grad = replicated_[i].mutable_grad();
    at::Tensor reduced = grad.defined() ? grad.to(reduce_dtype_) : at::zeros(replicated_[i].sizes(), replicated_[i].options().dtype(reduce_dtype_));
    Check(comm_->AllReduce(reduced), "all-reducing replicated gradients");
    reduced = reduced.to(at::kFloat).div_(comm_->world_size());
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
  for (const auto& unit : units_) tensors.push_back(unit->shard);
  tensors.insert(tensors.end(), replicated_masters_.begin(), replicated_masters_.end());
  return tensors;
}

absl::StatusOr<double> FullyShardedModule::ClipGradNorm(double max_norm) {
  torch::NoGradGuard no_grad;
  // Sums on the compute device (NCCL reduces device tensors), in float64.
  const at::TensorOptions sum_options = (units_.empty() ? at::TensorOptions() : units_[0]->full.options()).dtype(at::kDouble);
  at::Tensor sharded_sum = at::zeros({1}, sum_options);
  at::Tensor replicated_sum = at::zeros({1}, sum_options);
  for (const auto& unit : units_) {
    if (unit->shard.grad().defined()) sharded_sum += unit->shard.grad().to(sum_options).pow(2).sum();
  }
  for (const at::Tensor& master : replicated_masters_) {
    if (master.grad().defined()) replicated_sum += master.grad().to(sum_options).pow(2).sum();
  }
  // Shards are disjoint across ranks (sum them); replicas are the same everywhere.
  if (Shards(options_.strategy)) DRAY_RETURN_IF_ERROR(shard_comm_->AllReduce(sharded_sum));
  const double norm = std::sqrt((sharded_sum + replicated_sum).item<double>());
  if (norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    for (const at::Tensor& tensor : shards()) {
      if (tensor.grad().defined()) tensor.grad().mul_(scale);
    }
  }
  return norm;
}

absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> FullyShardedModule::FullParameters() {
  // Gathered from the float32 masters, whatever the compute dtype.
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, at::Tensor>> parameters;
  for (auto& unit : units_) {
    at::Tensor flat = at::empty({unit->padded}, unit->full.options().dtype(at::kFloat));
    if (Shards(options_.strategy)) {
      DRAY_RETURN_IF_ERROR(shard_comm_->AllGather(unit->shard.detach().to(flat.device()), flat));
    } else {
      flat.copy_(unit->shard.detach());
    }
    for (size_t i = 0; i < unit->params.size(); ++i) {
      parameters.emplace_back(unit->names[i],
                              flat.slice(0, unit->offsets[i], unit->offsets[i] + unit->params[i].numel())
                                  .view(unit->params[i].sizes()).cpu().clone());
    }
  }
  for (size_t i = 0; i < replicated_.size(); ++i) {
    parameters.emplace_back(replicated_names_[i], replicated_masters_[i].detach().cpu().clone());
  }
  return parameters;
}

int64_t FullyShardedModule::LargestUnitBytes() const {
  int64_t largest = 0;
  for (const auto& unit : units_) largest = std::max<int64_t>(largest, unit->padded * unit->full.element_size());
  return largest;
}

std::pair<int64_t, int64_t> FullyShardedModule::ShardRange(const Unit& unit) const {
  const int64_t size = unit.shard.numel();
  const int64_t begin = Shards(options_.strategy) ? shard_comm_->rank() * size : 0;
  return {begin, begin + size};
}

absl::Status FullyShardedModule::LoadShards(const Checkpoint& checkpoint) {
  torch::NoGradGuard no_grad;
  for (auto& unit : units_) {
    const auto [begin, end] = ShardRange(*unit);
    unit->shard.detach().zero_();
    for (size_t i = 0; i < unit->params.size(); ++i) {
      DRAY_ASSIGN_OR_RETURN(TensorInfo info, checkpoint.Info(unit->names[i]));
      if (at::IntArrayRef(info.shape) != unit->params[i].sizes()) {  // sizes survive a released storage
        return absl::InvalidArgumentError(absl::StrCat("tensor '", unit->names[i], "' has shape [",
                                                       absl::StrJoin(info.shape, ", "), "], the module expects [",
                                                       absl::StrJoin(unit->params[i].sizes(), ", "), "]"));
      }
      const int64_t offset = unit->offsets[i], numel = unit->params[i].numel();
      const int64_t from = std::max(begin, offset), to = std::min(end, offset + numel);
      if (from >= to) continue;  // not in this rank's shard: never read
      DRAY_ASSIGN_OR_RETURN(at::Tensor stored, checkpoint.Get(unit->names[i]));
      unit->shard.detach().slice(0, from - begin, to - begin).copy_(stored.reshape(-1).slice(0, from - offset, to - offset));
    }
  }
  for (size_t i = 0; i < replicated_.size(); ++i) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor stored, checkpoint.Load(replicated_names_[i], replicated_[i].sizes(), at::kFloat));
    replicated_masters_[i].detach().copy_(stored);
    replicated_[i].detach().copy_(stored);
  }
  return absl::OkStatus();
}

std::vector<std::pair<std::string, at::Tensor>> FullyShardedModule::LocalStateDict() const {
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (size_t u = 0; u < units_.size(); ++u) state.emplace_back(absl::StrCat("unit", u), units_[u]->shard.detach());
  for (size_t i = 0; i < replicated_.size(); ++i) state.emplace_back(replicated_names_[i], replicated_masters_[i].detach());
  return state;
}

absl::Status FullyShardedModule::LoadLocalStateDict(const std::vector<std::pair<std::string, at::Tensor>>& state) {
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  torch::NoGradGuard no_grad;
  for (auto [name, target] : LocalStateDict()) {
    auto it = by_name.find(name);
    if (it == by_name.end()) return absl::NotFoundError(absl::StrCat("local state dict has no '", name, "'"));
    if (it->second.sizes() != target.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat("local state dict: '", name, "' has shape [",
                                                     absl::StrJoin(it->second.sizes(), ", "), "], this rank's is [",
                                                     absl::StrJoin(target.sizes(), ", "),
                                                     "] (saved with other units or another world size?)"));
    }
    target.copy_(it->second);
  }
  BeforeForward();  // refresh working copies of replicated parameters
  return absl::OkStatus();
}

absl::Status FullyShardedModule::SaveFullStateDict(const std::string& path) {
  DRAY_ASSIGN_OR_RETURN(auto parameters, FullParameters());
  if (comm_->rank() == 0) DRAY_RETURN_IF_ERROR(WriteSafetensors(path, parameters, {{"format", "pt"}}));
  return comm_->Barrier();  // the file is complete when any rank returns
}

namespace {

std::string ShardFile(const std::string& dir, int rank, int world) {
  return absl::StrFormat("%s/shard-%05d-of-%05d.safetensors", dir, rank, world);
}

}  // namespace

absl::Status FullyShardedModule::SaveShardedStateDict(const std::string& dir) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  nlohmann::json layout = nlohmann::json::array();
  for (size_t u = 0; u < units_.size(); ++u) {
    const Unit& unit = *units_[u];
    tensors.emplace_back(absl::StrCat("unit", u), unit.shard.detach());
    nlohmann::json params = nlohmann::json::array();
    for (size_t i = 0; i < unit.params.size(); ++i) {
      params.push_back({{"name", unit.names[i]}, {"offset", unit.offsets[i]}, {"numel", unit.params[i].numel()}});
    }
    layout.push_back({{"padded", unit.padded}, {"params", params}});
  }
  for (size_t i = 0; i < replicated_.size(); ++i) tensors.emplace_back(replicated_names_[i], replicated_masters_[i].detach());
  const int64_t shard_world = Shards(options_.strategy) ? shard_comm_->world_size() : 1;
  const int64_t shard_rank = Shards(options_.strategy) ? shard_comm_->rank() : 0;
  if (comm_->rank() < shard_world) {  // one copy: the first shard group (NO_SHARD: rank 0)
    DRAY_RETURN_IF_ERROR(WriteSafetensors(ShardFile(dir, static_cast<int>(shard_rank), static_cast<int>(shard_world)), tensors,
                                          {{"dray_layout", layout.dump()}, {"world_size", absl::StrCat(shard_world)}}));
  }
  return comm_->Barrier();
}

absl::Status FullyShardedModule::LoadShardedStateDict(const std::string& dir) {
  // Find the saved world size from rank 0's file name.
  std::vector<std::shared_ptr<const SafetensorsFile>> files;
  for (int world = 1; world <= 4096 && files.empty(); ++world) {
    if (!std::filesystem::exists(ShardFile(dir, 0, world))) continue;
    for (int rank = 0; rank < world; ++rank) {
      DRAY_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(ShardFile(dir, rank, world)));
      files.push_back(std::move(file));
    }
  }
  if (files.empty()) return absl::NotFoundError(absl::StrCat(dir, " holds no shard-00000-of-*.safetensors"));
  const nlohmann::json layout = nlohmann::json::parse(files[0]->metadata().at("dray_layout"), nullptr, false);
  if (layout.is_discarded() || layout.size() != units_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": saved with ", layout.is_discarded() ? 0 : layout.size(),
                                                   " units, this module has ", units_.size()));
  }
  torch::NoGradGuard no_grad;
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = *units_[u];
    for (size_t i = 0; i < unit.params.size(); ++i) {
      const nlohmann::json& saved = layout[u]["params"][i];
      if (saved["name"] != unit.names[i] || saved["offset"] != unit.offsets[i] || saved["numel"] != unit.params[i].numel()) {
        return absl::InvalidArgumentError(absl::StrCat(dir, ": unit ", u, " was saved with a different parameter layout (at '",
                                                       unit.names[i], "')"));
      }
    }
    // This rank's range of the (new) flat parameter, read from the saved shards.
    const auto [begin, end] = ShardRange(unit);
    const int64_t saved_size = layout[u]["padded"].get<int64_t>() / static_cast<int64_t>(files.size());
    unit.shard.detach().zero_();
    for (size_t r = 0; r < files.size(); ++r) {
      const int64_t from = std::max<int64_t>(begin, r * saved_size), to = std::min<int64_t>(end, (r + 1) * saved_size);
      if (from >= to) continue;
      DRAY_ASSIGN_OR_RETURN(at::Tensor saved, files[r]->Get(absl::StrCat("unit", u)));
      unit.shard.detach().slice(0, from - begin, to - begin).copy_(saved.slice(0, from - r * saved_size, to - r * saved_size));
    }
  }
  for (size_t i = 0; i < replicated_.size(); ++i) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor saved, files[0]->Get(replicated_names_[i]));
    replicated_masters_[i].detach().copy_(saved);
    replicated_[i].detach().copy_(saved);
  }
  return absl::OkStatus();
}

FullyShardedModule::Bytes FullyShardedModule::LocalBytes() const {
  Bytes bytes;
  for (const auto& unit : units_) {
    bytes.parameters += unit->shard.nbytes() + (unit->gathered && Shards(options_.strategy) ? unit->full.nbytes() : 0);
    if (unit->shard.grad().defined()) bytes.gradients += unit->shard.grad().nbytes();
    for (const at::Tensor& param : unit->params) {
      if (param.grad().defined()) bytes.gradients += param.grad().nbytes();
    }
  }
  for (size_t i = 0; i < replicated_.size(); ++i) {
    const bool own_master = replicated_masters_[i].unsafeGetTensorImpl() == replicated_[i].unsafeGetTensorImpl();
    bytes.parameters += replicated_[i].nbytes() + (own_master ? 0 : replicated_masters_[i].nbytes());
    if (replicated_[i].grad().defined()) bytes.gradients += replicated_[i].grad().nbytes();
    if (!own_master && replicated_masters_[i].grad().defined()) bytes.gradients += replicated_masters_[i].grad().nbytes();
  }
  return bytes;
}

}  // namespace dray
