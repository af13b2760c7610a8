// Dispatch modes: how a call on a worker group splits the caller's input
// across ranks and joins the ranks' outputs again; dray's counterpart of
// verl's @register(dispatch_mode=Dispatch.X). A worker method names its mode;
// the controller looks it up here.
//
// Built-in modes (inputs are what the caller passes; W = world size):
//   ONE_TO_ALL         one input, sent to every rank   -> W outputs
//   ALL_TO_ALL         W inputs, one per rank (or one for all) -> W outputs
//   RANK_ZERO          one input, run on rank 0 only   -> 1 output
//   DP_COMPUTE         W inputs, one per rank          -> W outputs
//   DP_COMPUTE_PROTO   one batch, padded to a multiple of W and chunked;
//                      outputs concatenated, padding removed -> 1 output.
//                      For a method whose rows are independent
//                      (DispatchOptions::rows_independent): split as evenly
//                      as the rows allow, no padding, and ranks left without
//                      rows are not called (1 row on 4 ranks: 1 call)
//   DP_COMPUTE_METRIC  as DP_COMPUTE_PROTO, but outputs stay per rank (W
//                      outputs, padding rows included, never trimmed)
//
// Adding a mode:
//   DRAY_RETURN_IF_ERROR(DispatchRegistry::Global().Register(DispatchMode{
//       "FIRST_TWO", [](std::vector<DataProto> in, const DispatchOptions& o) {...},
//       [](std::vector<DataProto> out, const DispatchPlan&) {...}}));
//
// Thread-safety: DispatchRegistry is thread-safe; modes are immutable once
// registered and live as long as the registry.
#ifndef DRAY_DISPATCH_DISPATCH_MODE_H_
#define DRAY_DISPATCH_DISPATCH_MODE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "dispatch/data_proto.h"

namespace dray {

inline constexpr char kOneToAll[] = "ONE_TO_ALL";
inline constexpr char kAllToAll[] = "ALL_TO_ALL";
inline constexpr char kRankZero[] = "RANK_ZERO";
inline constexpr char kDpCompute[] = "DP_COMPUTE";
inline constexpr char kDpComputeProto[] = "DP_COMPUTE_PROTO";
inline constexpr char kDpComputeMetric[] = "DP_COMPUTE_METRIC";

// DispatchOptions: the group a call is split for, and what its method
// declares about its rows.
struct DispatchOptions {
  int world_size = 1;
  // Each output row depends on its input row alone (an edit, a rollout):
  // DP_COMPUTE_PROTO may split the batch unevenly instead of padding it.
  bool rows_independent = false;
};

// DispatchPlan: the input of each rank. A null entry means the rank is not
// called. Ranks that share one pointer receive the same bytes, encoded once.
struct DispatchPlan {
  std::vector<std::shared_ptr<const DataProto>> per_rank;
  // Rows appended to make the batch divide by the world size.
  int64_t pad_size = 0;
};

// DispatchMode: a named pair of dispatch and collect functions.
struct DispatchMode {
  std::string name;
  // dispatch splits the caller's inputs for `options.world_size` ranks.
  std::function<absl::StatusOr<DispatchPlan>(std::vector<DataProto> inputs,
                                             const DispatchOptions& options)>
      dispatch;
  // collect joins the outputs of the ranks that were called, in rank order.
  std::function<absl::StatusOr<std::vector<DataProto>>(std::vector<DataProto> outputs,
                                                       const DispatchPlan& plan)>
      collect;
};

// DispatchRegistry: dispatch modes by name.
class DispatchRegistry {
 public:
  // A registry with the built-in modes.
  DispatchRegistry();

  // Global returns the process-wide registry that worker groups use.
  static DispatchRegistry& Global();

  // Register adds `mode`; ALREADY_EXISTS if its name is taken.
  absl::Status Register(DispatchMode mode);

  // Find returns the mode called `name`; NOT_FOUND lists the known names.
  absl::StatusOr<const DispatchMode*> Find(absl::string_view name) const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<const DispatchMode>, std::less<>> modes_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace dray

#endif  // DRAY_DISPATCH_DISPATCH_MODE_H_
