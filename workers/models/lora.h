// LoRA adapters on a model's Linear layers, as peft attaches them: each
// targeted layer computes y = W x + b + (alpha / rank) B A x, with A [rank,
// in] drawn like peft (kaiming-uniform, a = sqrt(5)) and B [out, rank] zero,
// so a fresh adapter changes nothing. Adapter parameters are named
// "<layer>.lora_A.weight" and "<layer>.lora_B.weight", the names peft and
// diffusers give them (a diffusers LoRA file adds the "transformer." prefix).
//
//   LoraOptions lora{16, 32, {"to_q", "to_k", "to_v", "to_out.0"}};
//   DRAY_ASSIGN_OR_RETURN(int adapted, AddLoraAdapters(*transformer, lora, generator));
//   ... train the parameters that require grad (only the adapters) ...
//   SetLoraEnabled(*transformer, false);  // the base model: the reference policy
//   MergeLoraAdapters(*transformer);       // fold into W, drop adapters
//
// Thread-safety: not thread-safe (modules are not).
#ifndef DRAY_WORKERS_MODELS_LORA_H_
#define DRAY_WORKERS_MODELS_LORA_H_

#include <map>
#include <string>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dray {

struct LoraOptions {
  int64_t rank = 16;
  double alpha = 32;  // the adapter's output is scaled by alpha / rank
  // Layers to adapt, matched as peft matches them: a Linear whose name is
  // the target or ends with "." + target (e.g. "to_q", "img_mlp.net.2").
  std::vector<std::string> target_modules;
};

// AddLoraAdapters attaches an adapter to every targeted Linear of `root` and
// freezes every other parameter (only adapters require grad). Returns how
// many layers were adapted; a target that matches no Linear, a rank < 1 or
// a layer already adapted is INVALID_ARGUMENT.
absl::StatusOr<int> AddLoraAdapters(torch::nn::Module& root, const LoraOptions& options,
                                    at::Generator generator);

// SetLoraEnabled turns every adapter of `root` on or off.
void SetLoraEnabled(torch::nn::Module& root, bool enabled);

// LoraState returns the adapters' parameters by name ("...lora_A.weight").
std::map<std::string, at::Tensor> LoraState(const torch::nn::Module& root);

// LoadLoraAdapters attaches the adapters a LoRA file holds (what `dray
// train` writes, or a diffusers Qwen-Image LoRA: keys
// "transformer.<layer>.lora_A.weight" and ".lora_B.weight"; the rank from
// the shapes, alpha from the metadata "lora_alpha", else the rank) to the
// Linear layers of `root` they name. A layer the model lacks or a shape
// that does not fit is INVALID_ARGUMENT naming it. Returns the layers adapted.
absl::StatusOr<int> LoadLoraAdapters(torch::nn::Module& root, const std::string& path);

// MergeLoraAdapters folds each adapter into its layer's weight
// (W += alpha / rank * B A) and removes it.
void MergeLoraAdapters(torch::nn::Module& root);

}  // namespace dray

#endif  // DRAY_WORKERS_MODELS_LORA_H_
