#include "workers/train/vae_training.h"

#include <ATen/ATen.h>

#include <cmath>

#include "base/status_macros.h"
#include "workers/models/layers.h"

namespace dray {

absl::StatusOr<VaeLoss> VaeReconstructionLoss(qwen_image::AutoencoderKLQwenImageImpl& vae,
                                              const at::Tensor& pixels, const at::Tensor& eps,
                                              double beta) {
  DRAY_ASSIGN_OR_RETURN(qwen_image::LatentDistribution posterior, vae.Encode(pixels));
  if (!eps.sizes().equals(posterior.mean.sizes())) {
    return absl::InvalidArgumentError("the VAE's noise must have the latents' shape");
  }
  const at::Tensor z = posterior.mean + posterior.std * eps.to(posterior.mean.options());
  DRAY_ASSIGN_OR_RETURN(at::Tensor decoded, vae.Decode(z));
  VaeLoss out;
  out.reconstructions = decoded.select(2, 0);
  out.latents = posterior.mean;
  out.reconstruction_mse = at::mse_loss(AtLeastFloat32(decoded), AtLeastFloat32(pixels));
  out.kl = 0.5 * (posterior.mean.pow(2) + posterior.var - 1 - posterior.logvar).mean();
  out.loss = out.reconstruction_mse + beta * out.kl;
  return out;
}

double ReconstructionRmse255(double mse) { return std::sqrt(mse) * 127.5; }

}  // namespace dray
