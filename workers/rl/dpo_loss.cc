#include "workers/rl/dpo_loss.h"

#include <ATen/ATen.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "base/shape_string.h"
#include "workers/models/layers.h"
#include "workers/rl/per_sample.h"

namespace dray::rl {

absl::StatusOr<DpoLossOutput> DpoLoss(const DpoLossInput& in, const DpoLossOptions& options) {
  if (!in.prediction.defined() || !in.ref_prediction.defined() || !in.target.defined() ||
      in.prediction.dim() < 2 || in.prediction.size(0) == 0 || in.prediction.size(0) % 2 != 0 ||
      in.ref_prediction.sizes() != in.prediction.sizes() ||
      in.target.sizes() != in.prediction.sizes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DPO loss: prediction, ref_prediction and target must share one shape [2N, ...] (chosen, "
        "then rejected); got ",
        in.prediction.defined() ? ShapeString(in.prediction.sizes()) : "(none)"));
  }
  if (options.accumulation_steps < 1)
    return absl::InvalidArgumentError("DPO loss: accumulation_steps must be at least 1");
  const int64_t pairs = in.prediction.size(0) / 2;
  const at::Tensor target = AtLeastFloat32(in.target);  // flow_grpo's .float()
  auto errors = [&](const at::Tensor& prediction) {
    const at::Tensor error = (AtLeastFloat32(prediction) - target).pow(2);
    return error.mean(SampleDims(error));
  };
  DpoLossOutput out;
  out.mse = errors(in.prediction);
  out.ref_mse = errors(in.ref_prediction.detach());
  out.model_diff = out.mse.narrow(0, 0, pairs) - out.mse.narrow(0, pairs, pairs);
  out.ref_diff = out.ref_mse.narrow(0, 0, pairs) - out.ref_mse.narrow(0, pairs, pairs);
  out.w_l_diff = out.model_diff - out.ref_diff;
  out.inside = -0.5 * options.beta * out.w_l_diff;
  out.unscaled_loss = -at::log_sigmoid(out.inside).mean();
  out.loss = out.unscaled_loss / static_cast<double>(options.accumulation_steps);
  out.implicit_acc = (out.inside.detach() > 0).to(at::kFloat).mean();
  return out;
}

absl::StatusOr<std::vector<DpoPair>> DpoPairs(const std::vector<std::string>& groups,
                                              const std::vector<double>& rewards) {
  if (groups.size() != rewards.size())
    return absl::InvalidArgumentError("DPO pairs: one group key per reward");
  std::vector<std::string> order;
  std::map<std::string, std::vector<int64_t>> rows;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (rows.count(groups[i]) == 0) order.push_back(groups[i]);
    rows[groups[i]].push_back(static_cast<int64_t>(i));
  }
  std::vector<DpoPair> pairs;
  for (const std::string& group : order) {
    const std::vector<int64_t>& members = rows[group];
    if (members.size() < 2)
      return absl::InvalidArgumentError(
          absl::StrCat("DPO pairs: group '", group, "' has one sample, nothing to prefer it to"));
    DpoPair pair{members[0], members[0]};
    for (int64_t row : members) {
      if (rewards[row] > rewards[pair.chosen]) pair.chosen = row;
      if (rewards[row] < rewards[pair.rejected]) pair.rejected = row;
    }
    if (pair.chosen == pair.rejected) pair = {members[1], members[0]};
    pairs.push_back(pair);
  }
  return pairs;
}

}  // namespace dray::rl
