#include "runtime/sharding/optimizer_state.h"

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/libtorch_compat.h"
#include "base/status_macros.h"

namespace dray {
namespace {

constexpr char kStepFile[] = "/adamw.json";

}  // namespace

absl::Status SaveAdamWState(FullyShardedModule& module, torch::optim::AdamW& optimizer,
                            const std::string& dir) {
  std::vector<at::Tensor> first, second;
  int64_t step = 0;
  auto& states = optimizer.state();
  for (const at::Tensor& parameter : module.shards()) {
    auto found = states.find(OptimizerStateKey(parameter));
    if (found == states.end()) {
      first.push_back(at::zeros_like(parameter));
      second.push_back(at::zeros_like(parameter));
      continue;
    }
    auto& state = static_cast<torch::optim::AdamWParamState&>(*found->second);
    first.push_back(state.exp_avg());
    second.push_back(state.exp_avg_sq());
    step = state.step();
  }
  DRAY_RETURN_IF_ERROR(module.SaveShardedLike(dir, "adamw_exp_avg", first));
  DRAY_RETURN_IF_ERROR(module.SaveShardedLike(dir, "adamw_exp_avg_sq", second));
  return WriteFileAtomically(dir + kStepFile, nlohmann::json({{"step", step}}).dump());
}

absl::Status LoadAdamWState(FullyShardedModule& module, torch::optim::AdamW& optimizer,
                            const std::string& dir) {
  DRAY_ASSIGN_OR_RETURN(std::string text, ReadFile(dir + kStepFile));
  const nlohmann::json saved = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!saved.is_object() || !saved.contains("step") || !saved["step"].is_number_integer())
    return absl::DataLossError(absl::StrCat(dir, kStepFile, " holds no step count"));
  const int64_t step = saved["step"].get<int64_t>();
  const std::vector<at::Tensor> parameters = module.shards();
  std::vector<at::Tensor> first, second;
  for (const at::Tensor& parameter : parameters) {
    first.push_back(at::zeros_like(parameter, at::MemoryFormat::Contiguous));
    second.push_back(at::zeros_like(parameter, at::MemoryFormat::Contiguous));
  }
  DRAY_RETURN_IF_ERROR(module.LoadShardedLike(dir, "adamw_exp_avg", first));
  DRAY_RETURN_IF_ERROR(module.LoadShardedLike(dir, "adamw_exp_avg_sq", second));
  auto& states = optimizer.state();
  states.clear();
  if (step == 0) return absl::OkStatus();  // saved before the first step: nothing to restore
  for (size_t i = 0; i < parameters.size(); ++i) {
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->step(step);
    state->exp_avg(first[i]);
    state->exp_avg_sq(second[i]);
    states[OptimizerStateKey(parameters[i])] = std::move(state);
  }
  return absl::OkStatus();
}

}  // namespace dray
