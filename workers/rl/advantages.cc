#include "workers/rl/advantages.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "workers/rl/registry.h"

namespace dray::rl {
namespace {

constexpr double kStdEpsilon = 1e-4;

absl::Status CheckRewards(const std::vector<std::string>& groups, const at::Tensor& rewards) {
  if (!rewards.defined() || rewards.dim() < 1 || rewards.dim() > 2 ||
      rewards.size(0) != static_cast<int64_t>(groups.size()) || groups.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "advantages: rewards must be [N] or [N, T] with one group key per row; got ",
        rewards.defined() ? rewards.dim() : 0, "-d rewards for ", groups.size(), " keys"));
  }
  return absl::OkStatus();
}

// RowsOfGroups: each group's row indices, in row order.
std::map<std::string, std::vector<int64_t>> RowsOfGroups(const std::vector<std::string>& groups) {
  std::map<std::string, std::vector<int64_t>> rows;
  for (int64_t i = 0; i < static_cast<int64_t>(groups.size()); ++i) rows[groups[i]].push_back(i);
  return rows;
}

// GroupNormalized is flow_grpo's PerPromptStatTracker ("grpo"), in float64.
absl::StatusOr<at::Tensor> GroupNormalized(const std::vector<std::string>& groups,
                                           const at::Tensor& rewards,
                                           const AdvantageOptions& options) {
  DRAY_RETURN_IF_ERROR(CheckRewards(groups, rewards));
  const at::Tensor r = rewards.to(at::kCPU, at::kDouble);
  const at::Tensor batch_std = r.std(0, /*unbiased=*/false, /*keepdim=*/true);
  at::Tensor advantages = at::zeros_like(r);
  for (const auto& [group, members] : RowsOfGroups(groups)) {
    const at::Tensor index = at::tensor(members, at::kLong);
    const at::Tensor group_rewards = r.index_select(0, index);
    const at::Tensor mean = group_rewards.mean(0, /*keepdim=*/true);
    const at::Tensor std =
        options.global_std ? batch_std : group_rewards.std(0, /*unbiased=*/false, true);
    advantages.index_copy_(0, index, (group_rewards - mean) / (std + kStdEpsilon));
  }
  return advantages;
}

// BatchNormalized is flow_grpo's fallback without per-prompt tracking
// ("global"), in float32 as numpy computes it there.
absl::StatusOr<at::Tensor> BatchNormalized(const std::vector<std::string>& groups,
                                           const at::Tensor& rewards, const AdvantageOptions&) {
  DRAY_RETURN_IF_ERROR(CheckRewards(groups, rewards));
  const at::Tensor r = rewards.to(at::kCPU, at::kFloat);
  return (r - r.mean()) / (r.std(/*unbiased=*/false) + kStdEpsilon);
}

// DanceGroupNormalized is DanceGRPO's use_group advantage ("dance_grpo"):
// the unbiased std (n - 1) and 1e-8, in the rewards' own dtype; MixGRPO's
// with trimmed_ratio.
absl::StatusOr<at::Tensor> DanceGroupNormalized(const std::vector<std::string>& groups,
                                                const at::Tensor& rewards,
                                                const AdvantageOptions& options) {
  DRAY_RETURN_IF_ERROR(CheckRewards(groups, rewards));
  const at::Tensor r = rewards.to(at::kCPU);
  at::Tensor advantages = at::zeros_like(r);
  for (const auto& [group, members] : RowsOfGroups(groups)) {
    if (members.size() < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dance_grpo advantages: group '", group, "' has one sample, which has no unbiased std"));
    }
    const at::Tensor index = at::tensor(members, at::kLong);
    const at::Tensor group_rewards = r.index_select(0, index);
    // MixGRPO's trimmed statistics: the group's lowest rewards left out.
    const int64_t n = group_rewards.size(0);
    const int64_t trimmed =
        std::min<int64_t>(static_cast<int64_t>(n * options.trimmed_ratio), n - 1);
    const at::Tensor kept = std::get<0>(at::sort(group_rewards, 0)).narrow(0, trimmed, n - trimmed);
    advantages.index_copy_(0, index,
                           (group_rewards - kept.mean(0, /*keepdim=*/true)) /
                               (kept.std(0, /*unbiased=*/true, true) + 1e-8));
  }
  return advantages;
}

const std::map<std::string, AdvantageEstimator>& Registry() {
  static const auto* registry = new std::map<std::string, AdvantageEstimator>{
      {"grpo", GroupNormalized},
      {"global", BatchNormalized},
      {"dance_grpo", DanceGroupNormalized},
  };
  return *registry;
}

}  // namespace

absl::StatusOr<AdvantageEstimator> FindAdvantageEstimator(absl::string_view name) {
  return FindRegistered(Registry(), "advantage estimator", name);
}

absl::StatusOr<at::Tensor> MixedAdvantages(const AdvantageEstimator& estimate,
                                           const std::vector<std::string>& groups,
                                           const at::Tensor& rewards,
                                           const std::vector<double>& weights,
                                           const AdvantageOptions& options) {
  if (rewards.dim() != 2 || rewards.size(1) != static_cast<int64_t>(weights.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("advantages: mixed rewards must be [N, F] with one weight per column (",
                     weights.size(), " weights)"));
  }
  DRAY_ASSIGN_OR_RETURN(at::Tensor each, estimate(groups, rewards, options));
  return (each * at::tensor(weights, each.options())).sum(1);
}

std::vector<std::string> AdvantageEstimatorNames() { return RegisteredNames(Registry()); }

}  // namespace dray::rl
