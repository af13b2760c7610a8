#include "workers/models/lora.h"

#include <ATen/ATen.h>

#include <cmath>
#include <set>

#include <torch/csrc/autograd/grad_mode.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "workers/models/layers.h"

namespace dray {
namespace {

bool Targets(const std::string& name, const std::string& target) {
  return name == target || absl::EndsWith(name, "." + target);
}

// Adapted calls `visit` for every Linear of `root` that carries an adapter.
template <typename Visit>
void ForEachAdapted(const torch::nn::Module& root, Visit visit) {
  for (const auto& named : root.named_modules()) {
    auto* linear = named.value()->as<LinearImpl>();
    if (linear != nullptr && linear->lora_A != nullptr) visit(named.key(), *linear);
  }
}

}  // namespace

absl::StatusOr<int> AddLoraAdapters(torch::nn::Module& root, const LoraOptions& options,
                                    at::Generator generator) {
  if (options.rank < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoRA rank must be at least 1, got ", options.rank));
  }
  std::vector<std::pair<std::string, LinearImpl*>> chosen;
  std::set<std::string> matched;
  for (const auto& named : root.named_modules()) {
    auto* linear = named.value()->as<LinearImpl>();
    if (linear == nullptr) continue;
    for (const std::string& target : options.target_modules) {
      if (!Targets(named.key(), target)) continue;
      matched.insert(target);
      if (linear->lora_A != nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(named.key(), " already has a LoRA adapter"));
      }
      chosen.emplace_back(named.key(), linear);
      break;
    }
  }
  for (const std::string& target : options.target_modules) {
    if (!matched.count(target)) {
      return absl::InvalidArgumentError(
          absl::StrCat("LoRA target module '", target, "' matches no Linear layer"));
    }
  }
  torch::NoGradGuard no_grad;
  for (auto& parameter : root.parameters()) parameter.set_requires_grad(false);
  for (auto& [name, linear] : chosen) {
    const at::TensorOptions tensor = linear->weight.options();
    const int64_t in = linear->weight.size(1), out = linear->weight.size(0);
    linear->lora_A = linear->register_module(
        "lora_A",
        std::make_shared<LinearImpl>(LinearImpl::Options{in, options.rank, false, tensor}));
    linear->lora_B = linear->register_module(
        "lora_B",
        std::make_shared<LinearImpl>(LinearImpl::Options{options.rank, out, false, tensor}));
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));  // kaiming_uniform(a=sqrt(5))
    linear->lora_A->weight.uniform_(-bound, bound, generator);
    linear->lora_B->weight.zero_();
    linear->lora_scale = options.alpha / static_cast<double>(options.rank);
    linear->lora_enabled = true;
  }
  return static_cast<int>(chosen.size());
}

void SetLoraEnabled(torch::nn::Module& root, bool enabled) {
  ForEachAdapted(
      root, [enabled](const std::string&, LinearImpl& linear) { linear.lora_enabled = enabled; });
}

std::map<std::string, at::Tensor> LoraState(const torch::nn::Module& root) {
  std::map<std::string, at::Tensor> state;
  ForEachAdapted(root, [&state](const std::string& name, LinearImpl& linear) {
    state[name + ".lora_A.weight"] = linear.lora_A->weight;
    state[name + ".lora_B.weight"] = linear.lora_B->weight;
  });
  return state;
}

void MergeLoraAdapters(torch::nn::Module& root) {
  torch::NoGradGuard no_grad;
  ForEachAdapted(root, [](const std::string&, LinearImpl& linear) {
    linear.weight.add_(at::matmul(linear.lora_B->weight, linear.lora_A->weight), linear.lora_scale);
    linear.unregister_module("lora_A");
    linear.unregister_module("lora_B");
    linear.lora_A = nullptr;
    linear.lora_B = nullptr;
  });
}

}  // namespace dray
