// Dmd2Classifier: DMD2's GAN classifier head (its cls_pred_branch) for an
// MMDiT. DMD2's SD heads are convolutions on the fake UNet's bottleneck; a
// DiT has no bottleneck, so this one reads the fake score's image tokens
// after its last block ([B, S, D], QwenImageTransformerImpl's feature tap)
// and scores each token with an MLP (LayerNorm, Linear D -> D, SiLU,
// Linear D -> 1), averaging the output image's tokens' logits: one realism
// logit per row, [B, 1], trained with the fake score (it sits inside the
// fake score's module, a replicated part of its FSDP shards).
//
//   Dmd2Classifier head(inner_dim, options);
//   at::Tensor logits = head->forward(features, output_tokens);
//
// Thread-safety: not thread-safe (modules are not).
#ifndef DRAY_WORKERS_TRAIN_DMD2_CLASSIFIER_H_
#define DRAY_WORKERS_TRAIN_DMD2_CLASSIFIER_H_

#include <cstdint>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

namespace dray {

// kDmd2ClassifierName: the head's name in the fake score's module.
inline constexpr char kDmd2ClassifierName[] = "dmd2_classifier";

class Dmd2ClassifierImpl : public torch::nn::Module {
 public:
  Dmd2ClassifierImpl(int64_t dim, at::TensorOptions options);

  // forward: realism logits [B, 1] from features [B, S, dim], over the
  // first `tokens` tokens (the output image's; the condition images' follow).
  at::Tensor forward(const at::Tensor& features, int64_t tokens);

 private:
  torch::nn::LayerNorm norm_{nullptr};
  torch::nn::Linear hidden_{nullptr}, logit_{nullptr};
};
TORCH_MODULE(Dmd2Classifier);

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_DMD2_CLASSIFIER_H_
