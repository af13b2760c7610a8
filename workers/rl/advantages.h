// Advantage estimators: how one step's rewards become per-sample advantages,
// registered by name (`algorithm.adv_estimator`) so that a new estimator is
// one function and one line in advantages.cc.
//
//   DRAY_ASSIGN_OR_RETURN(AdvantageEstimator estimate, FindAdvantageEstimator("grpo"));
//   DRAY_ASSIGN_OR_RETURN(at::Tensor advantages, estimate(groups, rewards, {}));
//
// Built in (numbers as flow_grpo computes them; see
// tests/data/reference/flow_grpo/README.md, section b):
//   grpo    per group (a prompt with its input image): (r - mean) / (std + 1e-4),
//           std with ddof 0, over the group or, with global_std, over the
//           whole batch; float64 (flow_grpo's PerPromptStatTracker).
//   global  over the whole batch: (r - mean) / (std + 1e-4), float32 (the
//           fallback flow_grpo uses without per-prompt tracking).
//   dance_grpo  DanceGRPO's (tests/data/reference/dance_grpo/README.md, c):
//           per group (r - mean) / (std + 1e-8), std unbiased (n - 1), in the
//           rewards' dtype; one group holding every row is DanceGRPO's
//           use_group False. MixGRPO's is the same, and with trimmed_ratio
//           takes each group's mean and std without its lowest
//           min(int(n trimmed_ratio), n - 1) rewards
//           (tests/data/reference/mix_grpo/README.md, e).
//
// Thread-safety: pure functions.
#ifndef DRAY_WORKERS_RL_ADVANTAGES_H_
#define DRAY_WORKERS_RL_ADVANTAGES_H_

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dray::rl {

struct AdvantageOptions {
  // grpo: normalise by the std of the whole batch instead of each group's.
  bool global_std = true;
  // dance_grpo: the share of each group's lowest rewards its statistics leave out.
  double trimmed_ratio = 0.0;
};

// AdvantageEstimator maps `rewards` ([N] or [N, T]: one row per sample) and
// each sample's group key to advantages shaped like `rewards`.
using AdvantageEstimator = std::function<absl::StatusOr<at::Tensor>(
    const std::vector<std::string>& groups, const at::Tensor& rewards,
    const AdvantageOptions& options)>;

// FindAdvantageEstimator returns the estimator registered as `name`;
// NOT_FOUND lists the registered names.
absl::StatusOr<AdvantageEstimator> FindAdvantageEstimator(absl::string_view name);

// MixedAdvantages: MixGRPO's advantage_aggr: the advantages of each reward
// column of `rewards` [N, F] (each reward function's scores) by `estimate`,
// weighted by `weights` [F] and summed ([N]). One column weighted 1 gives
// `estimate`'s own advantages of it.
absl::StatusOr<at::Tensor> MixedAdvantages(const AdvantageEstimator& estimate,
                                           const std::vector<std::string>& groups,
                                           const at::Tensor& rewards,
                                           const std::vector<double>& weights,
                                           const AdvantageOptions& options);

// AdvantageEstimatorNames lists the registered names, sorted.
std::vector<std::string> AdvantageEstimatorNames();

}  // namespace dray::rl

#endif  // DRAY_WORKERS_RL_ADVANTAGES_H_
