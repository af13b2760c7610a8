// FullyShardedModule's state dicts: full, sharded and local, and loading
// shards from a checkpoint.
#include <ATen/ATen.h>

#include <filesystem>
#include <map>

#include <torch/csrc/autograd/grad_mode.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "runtime/sharding/fully_sharded.h"
#include "runtime/sharding/fully_sharded_unit.h"

namespace dray {

absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>>
FullyShardedModule::FullParameters() {
  // In the masters' dtype, whatever the compute dtype (frozen parameters, stored in it, widen).
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, at::Tensor>> parameters;
  for (auto& unit : units_) {
    at::Tensor flat = at::empty({unit->padded}, unit->full.options().dtype(master_dtype_));
    if (ShardsParameters(options_.strategy)) {
      DRAY_RETURN_IF_ERROR(
          shard_comm_->AllGather(unit->shard.detach().to(flat.device(), master_dtype_), flat));
    } else {
      flat.copy_(unit->shard.detach());
    }
    for (size_t i = 0; i < unit->params.size(); ++i) {
      parameters.emplace_back(unit->names[i], flat.slice(0, unit->offsets[i],
                                                         unit->offsets[i] + unit->params[i].numel())
                                                  .view(unit->params[i].sizes())
                                                  .cpu()
                                                  .clone());
    }
  }
  for (size_t i = 0; i < replicated_.size(); ++i) {
    parameters.emplace_back(replicated_names_[i], replicated_masters_[i].detach().to(
                                                      at::kCPU, master_dtype_, false, true));
  }
  return parameters;
}

std::pair<int64_t, int64_t> FullyShardedModule::ShardRange(const Unit& unit) const {
  const int64_t size = unit.shard.numel();
  const int64_t begin = ShardsParameters(options_.strategy) ? shard_comm_->rank() * size : 0;
  return {begin, begin + size};
}

absl::Status FullyShardedModule::LoadShards(const Checkpoint& checkpoint,
                                            const std::set<std::string>& kept) {
  torch::NoGradGuard no_grad;
  for (auto& unit : units_) {
    const auto [begin, end] = ShardRange(*unit);
    unit->shard.detach().zero_();
    for (size_t i = 0; i < unit->params.size(); ++i) {
      DRAY_ASSIGN_OR_RETURN(TensorInfo info, checkpoint.Info(unit->names[i]));
      if (at::IntArrayRef(info.shape) !=
          unit->params[i].sizes()) {  // sizes survive a released storage
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", unit->names[i], "' has shape [", absl::StrJoin(info.shape, ", "),
            "], the module expects [", absl::StrJoin(unit->params[i].sizes(), ", "), "]"));
      }
      const int64_t offset = unit->offsets[i], numel = unit->params[i].numel();
      const int64_t from = std::max(begin, offset), to = std::min(end, offset + numel);
      if (from >= to) continue;  // not in this rank's shard: never read
      DRAY_ASSIGN_OR_RETURN(at::Tensor stored, checkpoint.Get(unit->names[i]));
      unit->shard.detach()
          .slice(0, from - begin, to - begin)
          .copy_(stored.reshape(-1).slice(0, from - offset, to - offset));
    }
  }
  for (size_t i = 0; i < replicated_.size(); ++i) {
    if (kept.count(replicated_names_[i]) > 0) continue;
    DRAY_ASSIGN_OR_RETURN(
        at::Tensor stored,
        checkpoint.Load(replicated_names_[i], replicated_[i].sizes(), master_dtype_));
    replicated_masters_[i].detach().copy_(stored);
    replicated_[i].detach().copy_(stored);
  }
  return absl::OkStatus();
}

std::vector<std::pair<std::string, at::Tensor>> FullyShardedModule::LocalStateDict() const {
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (size_t u = 0; u < units_.size(); ++u)
    state.emplace_back(absl::StrCat("unit", u), units_[u]->shard.detach());
  for (size_t i = 0; i < replicated_.size(); ++i)
    state.emplace_back(replicated_names_[i], replicated_masters_[i].detach());
  return state;
}

absl::Status FullyShardedModule::LoadLocalStateDict(
    const std::vector<std::pair<std::string, at::Tensor>>& state) {
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  torch::NoGradGuard no_grad;
  for (auto [name, target] : LocalStateDict()) {
    auto it = by_name.find(name);
    if (it == by_name.end())
      return absl::NotFoundError(absl::StrCat("local state dict has no '", name, "'"));
    if (it->second.sizes() != target.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "local state dict: '", name, "' has shape [", absl::StrJoin(it->second.sizes(), ", "),
          "], this rank's is [", absl::StrJoin(target.sizes(), ", "),
          "] (saved with other units or another world size?)"));
    }
    target.copy_(it->second);
  }
  BeforeForward();  // refresh working copies of replicated parameters
  return absl::OkStatus();
}

absl::Status FullyShardedModule::SaveFullStateDict(const std::string& path) {
  DRAY_ASSIGN_OR_RETURN(auto parameters, FullParameters());
  if (comm_->rank() == 0)
    DRAY_RETURN_IF_ERROR(WriteSafetensors(path, parameters, {{"format", "pt"}}));
  return comm_->Barrier();  // the file is complete when any rank returns
}

namespace {

std::string ShardFile(const std::string& dir, const std::string& prefix, int rank, int world) {
  return absl::StrFormat("%s/%s-%05d-of-%05d.safetensors", dir, prefix, rank, world);
}

}  // namespace

std::vector<FullyShardedModule::ShardSlot> FullyShardedModule::AllSlots() const {
  std::vector<ShardSlot> slots;
  for (size_t u = 0; u < units_.size(); ++u)
    slots.push_back({units_[u].get(), absl::StrCat("unit", u), units_[u]->shard});
  for (size_t i = 0; i < replicated_.size(); ++i)
    slots.push_back({nullptr, replicated_names_[i], replicated_masters_[i]});
  return slots;
}

absl::StatusOr<std::vector<FullyShardedModule::ShardSlot>> FullyShardedModule::SlotsLikeShards(
    const std::vector<at::Tensor>& like_shards) const {
  std::vector<ShardSlot> slots;
  for (const ShardSlot& slot : AllSlots()) {
    const bool trainable =
        slot.unit != nullptr ? slot.unit->trainable : slot.tensor.requires_grad();
    if (trainable) slots.push_back(slot);
  }
  if (like_shards.size() != slots.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        like_shards.size(), " tensors given for the module's ", slots.size(), " trainable shards"));
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    if (like_shards[i].sizes() != slots[i].tensor.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", i, " has shape [", absl::StrJoin(like_shards[i].sizes(), ", "), "], shard '",
          slots[i].key, "' is [", absl::StrJoin(slots[i].tensor.sizes(), ", "), "]"));
    }
    slots[i].tensor = like_shards[i];
  }
  return slots;
}

absl::Status FullyShardedModule::WriteSlots(const std::string& dir, const std::string& prefix,
                                            const std::vector<ShardSlot>& slots) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  nlohmann::json layout = nlohmann::json::object();
  for (const ShardSlot& slot : slots) {
    tensors.emplace_back(slot.key, slot.tensor.detach());
    if (slot.unit == nullptr) continue;
    nlohmann::json params = nlohmann::json::array();
    for (size_t i = 0; i < slot.unit->params.size(); ++i) {
      params.push_back({{"name", slot.unit->names[i]},
                        {"offset", slot.unit->offsets[i]},
                        {"numel", slot.unit->params[i].numel()}});
    }
    layout[slot.key] = {{"padded", slot.unit->padded}, {"params", params}};
  }
  const int64_t shard_world = ShardsParameters(options_.strategy) ? shard_comm_->world_size() : 1;
  const int64_t shard_rank = ShardsParameters(options_.strategy) ? shard_comm_->rank() : 0;
  if (comm_->rank() < shard_world) {  // one copy: the first shard group (NO_SHARD: rank 0)
    DRAY_RETURN_IF_ERROR(WriteSafetensors(
        ShardFile(dir, prefix, static_cast<int>(shard_rank), static_cast<int>(shard_world)),
        tensors, {{"dray_layout", layout.dump()}, {"world_size", absl::StrCat(shard_world)}}));
  }
  return comm_->Barrier();
}

absl::Status FullyShardedModule::ReadSlots(const std::string& dir, const std::string& prefix,
                                           const std::vector<ShardSlot>& slots) {
  // Find the saved world size from rank 0's file name.
  std::vector<std::shared_ptr<const SafetensorsFile>> files;
  for (int world = 1; world <= 4096 && files.empty(); ++world) {
    if (!std::filesystem::exists(ShardFile(dir, prefix, 0, world))) continue;
    for (int rank = 0; rank < world; ++rank) {
      DRAY_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(ShardFile(dir, prefix, rank, world)));
      files.push_back(std::move(file));
    }
  }
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat(dir, " holds no ", prefix, "-00000-of-*.safetensors"));
  }
  const auto layout_text = files[0]->metadata().find("dray_layout");
  const nlohmann::json layout =
      layout_text == files[0]->metadata().end()
          ? nlohmann::json()
          : nlohmann::json::parse(layout_text->second, nullptr, /*allow_exceptions=*/false);
  if (!layout.is_object()) {
    return absl::DataLossError(
        absl::StrCat(dir, ": ", prefix, " files carry no dray_layout (not written by dray?)"));
  }
  torch::NoGradGuard no_grad;
  for (const ShardSlot& slot : slots) {
    if (slot.unit == nullptr) {
      DRAY_ASSIGN_OR_RETURN(at::Tensor saved, files[0]->Get(slot.key));
      if (saved.sizes() != slot.tensor.sizes()) {
        return absl::InvalidArgumentError(absl::StrCat(
            dir, ": ", slot.key, " was saved with shape [", absl::StrJoin(saved.sizes(), ", "),
            "], the module's is [", absl::StrJoin(slot.tensor.sizes(), ", "), "]"));
      }
      slot.tensor.detach().copy_(saved);
      continue;
    }
    const Unit& unit = *slot.unit;
    const auto saved_unit = layout.find(slot.key);
    if (saved_unit == layout.end() || !saved_unit->is_object() || !saved_unit->contains("params") ||
        !(*saved_unit)["params"].is_array() ||
        (*saved_unit)["params"].size() != unit.params.size() || !saved_unit->contains("padded") ||
        !(*saved_unit)["padded"].is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, ": ", prefix, " was saved without ", slot.key,
                       " as this module has it (another model, or other trainable parameters?)"));
    }
    for (size_t i = 0; i < unit.params.size(); ++i) {
      const nlohmann::json& saved = (*saved_unit)["params"][i];
      if (!saved.is_object() || saved.value("name", "") != unit.names[i] ||
          saved.value("offset", int64_t{-1}) != unit.offsets[i] ||
          saved.value("numel", int64_t{-1}) != unit.params[i].numel()) {
        return absl::InvalidArgumentError(
            absl::StrCat(dir, ": ", slot.key, " was saved with a different parameter layout (at '",
                         unit.names[i], "')"));
      }
    }
    // This rank's range of the (new) flat parameter, read from the saved shards.
    const auto [begin, end] = ShardRange(unit);
    const int64_t saved_size =
        (*saved_unit)["padded"].get<int64_t>() / static_cast<int64_t>(files.size());
    slot.tensor.detach().zero_();
    for (size_t r = 0; r < files.size(); ++r) {
      const int64_t from = std::max<int64_t>(begin, r * saved_size),
                    to = std::min<int64_t>(end, (r + 1) * saved_size);
      if (from >= to) continue;
      DRAY_ASSIGN_OR_RETURN(at::Tensor saved, files[r]->Get(slot.key));
      slot.tensor.detach()
          .slice(0, from - begin, to - begin)
          .copy_(saved.slice(0, from - r * saved_size, to - r * saved_size));
    }
  }
  return absl::OkStatus();
}

absl::Status FullyShardedModule::SaveShardedStateDict(const std::string& dir) {
  return WriteSlots(dir, "shard", AllSlots());
}

absl::Status FullyShardedModule::LoadShardedStateDict(const std::string& dir) {
  DRAY_RETURN_IF_ERROR(ReadSlots(dir, "shard", AllSlots()));
  BeforeForward();  // refresh working copies of replicated parameters
  return absl::OkStatus();
}

absl::Status FullyShardedModule::SaveShardedLike(const std::string& dir, const std::string& name,
                                                 const std::vector<at::Tensor>& like_shards) {
  DRAY_ASSIGN_OR_RETURN(std::vector<ShardSlot> slots, SlotsLikeShards(like_shards));
  return WriteSlots(dir, name, slots);
}

absl::Status FullyShardedModule::LoadShardedLike(const std::string& dir, const std::string& name,
                                                 const std::vector<at::Tensor>& like_shards) {
  DRAY_ASSIGN_OR_RETURN(std::vector<ShardSlot> slots, SlotsLikeShards(like_shards));
  DRAY_RETURN_IF_ERROR(ReadSlots(dir, name, slots));
  BeforeForward();  // loaded into the masters: refresh the replicated working copies
  return absl::OkStatus();
}

}  // namespace dray
