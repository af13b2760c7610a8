#include "dispatch/dispatch_mode.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace dray {
namespace {

// SingleInput returns the one input of a mode that takes one (none: empty batch).
absl::StatusOr<std::shared_ptr<const DataProto>> SingleInput(absl::string_view mode,
                                                             std::vector<DataProto> inputs) {
  if (inputs.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(mode, " takes one input, got ", inputs.size()));
  }
  return std::make_shared<const DataProto>(inputs.empty() ? DataProto() : std::move(inputs[0]));
}

absl::StatusOr<DispatchPlan> OneToAll(std::vector<DataProto> inputs,
                                      const DispatchOptions& options) {
  DRAY_ASSIGN_OR_RETURN(auto input, SingleInput(kOneToAll, std::move(inputs)));
  return DispatchPlan{std::vector<std::shared_ptr<const DataProto>>(options.world_size, input), 0};
}

absl::StatusOr<DispatchPlan> RankZero(std::vector<DataProto> inputs,
                                      const DispatchOptions& options) {
  DRAY_ASSIGN_OR_RETURN(auto input, SingleInput(kRankZero, std::move(inputs)));
  DispatchPlan plan{std::vector<std::shared_ptr<const DataProto>>(options.world_size), 0};
  plan.per_rank[0] = std::move(input);
  return plan;
}

// PerRank gives input i to rank i; `broadcast_one` also lets one input go to all.
absl::StatusOr<DispatchPlan> PerRank(absl::string_view mode, bool broadcast_one,
                                     std::vector<DataProto> inputs,
                                     const DispatchOptions& options) {
  if (broadcast_one && inputs.size() == 1) return OneToAll(std::move(inputs), options);
  if (static_cast<int>(inputs.size()) != options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(mode, " needs one input per rank (",
                                                   options.world_size, "), got ", inputs.size()));
  }
  DispatchPlan plan;
  for (DataProto& input : inputs) {
    plan.per_rank.push_back(std::make_shared<const DataProto>(std::move(input)));
  }
  return plan;
}

// SplitUnevenly gives each rank n / W consecutive rows of `input`, and the
// first n % W ranks one more (so rank 0 always runs the most rows, and its
// progress tells the whole call's); ranks left without rows are not called.
absl::StatusOr<DispatchPlan> SplitUnevenly(const DataProto& input, int world_size) {
  DispatchPlan plan;
  const int64_t rows = input.size(), base = rows / world_size, extra = rows % world_size;
  for (int rank = 0; rank < world_size; ++rank) {
    const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
    const int64_t end = begin + base + (rank < extra ? 1 : 0);
    if (begin == end) {
      plan.per_rank.push_back(nullptr);
      continue;
    }
    DRAY_ASSIGN_OR_RETURN(DataProto rows_of_rank, input.Slice(begin, end));
    plan.per_rank.push_back(std::make_shared<const DataProto>(std::move(rows_of_rank)));
  }
  if (rows == 0) plan.per_rank[0] = std::make_shared<const DataProto>(input);  // keep the schema
  return plan;
}

absl::StatusOr<DispatchPlan> SplitBatch(absl::string_view mode, bool may_split_unevenly,
                                        std::vector<DataProto> inputs,
                                        const DispatchOptions& options) {
  const int world_size = options.world_size;
  DRAY_ASSIGN_OR_RETURN(auto input, SingleInput(mode, std::move(inputs)));
  if (may_split_unevenly && options.rows_independent) return SplitUnevenly(*input, world_size);
  DRAY_ASSIGN_OR_RETURN(PaddedDataProto padded, input->PadToDivisor(world_size));
  DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> chunks, padded.data.Chunk(world_size));
  DispatchPlan plan;
  plan.pad_size = padded.pad_size;
  for (DataProto& chunk : chunks) {
    plan.per_rank.push_back(std::make_shared<const DataProto>(std::move(chunk)));
  }
  return plan;
}

absl::StatusOr<std::vector<DataProto>> KeepPerRank(std::vector<DataProto> outputs,
                                                   const DispatchPlan&) {
  return outputs;
}

absl::StatusOr<std::vector<DataProto>> ConcatAndUnpad(std::vector<DataProto> outputs,
                                                      const DispatchPlan& plan) {
  DRAY_ASSIGN_OR_RETURN(DataProto joined, DataProto::Concat(outputs));
  if (joined.size() < plan.pad_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        kDpComputeProto, ": the ranks returned ", joined.size(), " rows in all, fewer than the ",
        plan.pad_size, " padding rows to remove (a method must return one row per input row)"));
  }
  DRAY_ASSIGN_OR_RETURN(DataProto result, joined.Unpad(plan.pad_size));
  return std::vector<DataProto>{std::move(result)};
}

std::vector<DispatchMode> BuiltInModes() {
  using namespace std::placeholders;
  return {
      {std::string(kOneToAll), OneToAll, KeepPerRank},
      {std::string(kAllToAll), std::bind(PerRank, kAllToAll, true, _1, _2), KeepPerRank},
      {std::string(kRankZero), RankZero, KeepPerRank},
      {std::string(kDpCompute), std::bind(PerRank, kDpCompute, false, _1, _2), KeepPerRank},
      {std::string(kDpComputeProto), std::bind(SplitBatch, kDpComputeProto, true, _1, _2),
       ConcatAndUnpad},
      // Per-rank outputs (metrics) need every rank: always padded.
      {std::string(kDpComputeMetric), std::bind(SplitBatch, kDpComputeMetric, false, _1, _2),
       KeepPerRank},
  };
}

}  // namespace

DispatchRegistry::DispatchRegistry() {
  for (DispatchMode& mode : BuiltInModes()) Register(std::move(mode)).IgnoreError();
}

DispatchRegistry& DispatchRegistry::Global() {
  static DispatchRegistry* registry = new DispatchRegistry();
  return *registry;
}

absl::Status DispatchRegistry::Register(DispatchMode mode) {
  if (mode.name.empty() || !mode.dispatch || !mode.collect) {
    return absl::InvalidArgumentError(
        "a dispatch mode needs a name, a dispatch function and a collect function");
  }
  absl::MutexLock lock(&mu_);
  if (modes_.count(mode.name) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("dispatch mode ", mode.name, " already exists"));
  }
  std::string name = mode.name;
  modes_.emplace(std::move(name), std::make_unique<const DispatchMode>(std::move(mode)));
  return absl::OkStatus();
}

absl::StatusOr<const DispatchMode*> DispatchRegistry::Find(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = modes_.find(name);
  if (it != modes_.end()) return it->second.get();
  std::vector<absl::string_view> known;
  for (const auto& entry : modes_) known.push_back(entry.first);
  return absl::NotFoundError(absl::StrCat("unknown dispatch mode '", name,
                                          "'; known modes: ", absl::StrJoin(known, ", ")));
}

}  // namespace dray
