#include "workers/models/lora.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <set>

#include <torch/csrc/autograd/grad_mode.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "runtime/io/safetensors.h"
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
    // Drawn on the CPU (the generator's device), then placed.
    linear->lora_A->weight.copy_(
        at::empty(linear->lora_A->weight.sizes(), at::kFloat).uniform_(-bound, bound, generator));
    linear->lora_B->weight.zero_();
    linear->lora_scale = options.alpha / static_cast<double>(options.rank);
    linear->lora_enabled = true;
  }
  return static_cast<int>(chosen.size());
}

absl::StatusOr<int> LoadLoraAdapters(torch::nn::Module& root, const std::string& path) {
  DRAY_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
  constexpr absl::string_view kPrefix = "transformer.", kA = ".lora_A.weight";
  std::vector<std::string> layers;
  int64_t rank = 0;
  for (const std::string& name : file->names()) {
    if (!absl::EndsWith(name, kA)) continue;
    const absl::string_view layer = absl::string_view(name).substr(0, name.size() - kA.size());
    layers.emplace_back(absl::StartsWith(layer, kPrefix) ? layer.substr(kPrefix.size()) : layer);
    DRAY_ASSIGN_OR_RETURN(TensorInfo info, file->Info(name));
    rank = info.shape.empty() ? 0 : info.shape[0];
  }
  if (layers.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " holds no LoRA adapters (*", kA, ")"));
  }
  auto alpha = file->metadata().find("lora_alpha");
  const LoraOptions options{
      rank, alpha == file->metadata().end() ? static_cast<double>(rank) : std::stod(alpha->second),
      layers};
  DRAY_ASSIGN_OR_RETURN(
      int adapted, AddLoraAdapters(root, options, at::make_generator<at::CPUGeneratorImpl>(0)));
  torch::NoGradGuard no_grad;
  for (const auto& [name, tensor] : LoraState(root)) {
    const std::string key =
        file->contains(std::string(kPrefix) + name) ? std::string(kPrefix) + name : name;
    DRAY_ASSIGN_OR_RETURN(at::Tensor stored, file->Get(key));
    if (stored.sizes() != tensor.sizes()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", key, " has shape [", absl::StrJoin(stored.sizes(), ", "),
                       "], the model's adapter [", absl::StrJoin(tensor.sizes(), ", "), "]"));
    }
    at::Tensor(tensor).copy_(stored);
  }
  return adapted;
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
