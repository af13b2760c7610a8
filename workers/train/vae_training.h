// Training Qwen-Image's VAE as an autoencoder (`algorithm.name: vae`): the
// encoder's posterior, a reparameterised sample, decoded back (a beta-VAE):
//
//   z = mean + std * eps,   loss = mse(decode(z), x) + beta * KL(q(z | x) || N(0, 1))
//
// with pixels x in [-1, 1] and the KL averaged over latent elements. A
// small beta keeps the latents near unit scale, where the transformer's
// flow matching expects them.
//
//   DRAY_ASSIGN_OR_RETURN(VaeLoss out, VaeReconstructionLoss(*vae, pixels, eps, beta));
//   out.loss.backward();
#ifndef DRAY_WORKERS_TRAIN_VAE_TRAINING_H_
#define DRAY_WORKERS_TRAIN_VAE_TRAINING_H_

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "workers/models/qwen_image/vae.h"

namespace dray {

struct VaeLoss {
  at::Tensor loss;                // scalar, differentiable
  at::Tensor reconstruction_mse;  // scalar, in [-1, 1] pixel units
  at::Tensor kl;                  // scalar, per latent element
  at::Tensor latents;             // the posterior's mean [B, z_dim, 1, h, w]
  at::Tensor reconstructions;     // [B, 3, H, W] in [-1, 1]
};

// VaeReconstructionLoss: `pixels` [B, 3, 1, H, W] in [-1, 1] and `eps`
// (standard normal, the latents' shape [B, z_dim, 1, H/s, W/s]).
absl::StatusOr<VaeLoss> VaeReconstructionLoss(qwen_image::AutoencoderKLQwenImageImpl& vae,
                                              const at::Tensor& pixels, const at::Tensor& eps,
                                              double beta);

// ReconstructionRmse255: the root mean squared error of a [-1, 1] MSE, in
// 0..255 pixel levels (what people read off an image).
double ReconstructionRmse255(double mse);

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_VAE_TRAINING_H_
