#include "workers/train/reward_worker.h"

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/train/rewards.h"

namespace dray {

RewardWorker::RewardWorker() {
  MethodOptions per_row;
  per_row.dispatch_mode = kDpComputeProto;
  Def("compute_reward", &RewardWorker::ComputeReward, per_row);
}

absl::StatusOr<DataProto> RewardWorker::ComputeReward(const DataProto& batch) {
  DRAY_ASSIGN_OR_RETURN(Json functions_json, batch.GetMeta<Json>("functions"));
  const nlohmann::json names = nlohmann::json::parse(functions_json.text, nullptr, false);
  if (!names.is_array())
    return absl::InvalidArgumentError("meta \"functions\" must be a JSON list of names");
  std::vector<RewardFunction> functions;
  for (const nlohmann::json& name : names) {
    DRAY_ASSIGN_OR_RETURN(RewardFunction function,
                          FindRewardFunction(name.is_string() ? name.get<std::string>() : ""));
    functions.push_back(std::move(function));
  }
  DRAY_ASSIGN_OR_RETURN(const std::vector<Image>* outputs, batch.GetRows<Image>(kEditedColumn));
  DRAY_ASSIGN_OR_RETURN(const std::vector<Image>* inputs, batch.GetRows<Image>(kImagesColumn));
  DRAY_ASSIGN_OR_RETURN(const std::vector<std::string>* instructions,
                        batch.GetRows<std::string>(kInstructionsColumn));
  DRAY_ASSIGN_OR_RETURN(const std::vector<Json>* fields, batch.GetRows<Json>(kRewardFieldsColumn));
  const std::vector<Image>* targets = nullptr;
  if (batch.HasColumn(kRewardTargetsColumn)) {
    DRAY_ASSIGN_OR_RETURN(targets, batch.GetRows<Image>(kRewardTargetsColumn));
  }
  at::Tensor scores =
      at::empty({batch.size(), static_cast<int64_t>(functions.size())}, at::kDouble);
  for (int64_t i = 0; i < batch.size(); ++i) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor output, DecodeImageRow((*outputs)[i]));
    DRAY_ASSIGN_OR_RETURN(at::Tensor input, DecodeImageRow((*inputs)[i]));
    RewardInput sample{output, input, (*instructions)[i],
                       nlohmann::json::parse((*fields)[i].text, nullptr, false)};
    if (targets != nullptr && !(*targets)[i].bytes.empty()) {
      DRAY_ASSIGN_OR_RETURN(sample.target, DecodeImageRow((*targets)[i]));
    }
    for (size_t f = 0; f < functions.size(); ++f) {
      absl::StatusOr<double> value = functions[f](sample);
      if (!value.ok()) {
        return absl::Status(value.status().code(),
                            absl::StrCat("reward ", names[f].get<std::string>(), ", row ", i, ": ",
                                         value.status().message()));
      }
      scores[i][f] = *value;
    }
  }
  return DataProto::Make({{kRewardScoresColumn, scores}});
}

}  // namespace dray
