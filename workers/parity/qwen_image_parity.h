// Parity with diffusers: the reference cases of a folder laid out like
// tests/data/reference/qwen_image (see its README), run through dray.
//
// A component folder is recognized by content:
//   scheduler/   scheduler_config.json + cases.json (schedules, Euler steps)
//   helpers/     cases.json + pack_unpack.safetensors
//   any folder whose config.json has _class_name QwenImageTransformer2DModel
//     or AutoencoderKLQwenImage, with case_*.safetensors files
//
//   for (const ParityCase& c : QwenImageParityCases("reference/qwen_image/vae_tiny")) ...
//
// Tolerances are the reference README's: transformer and VAE outputs
// atol = rtol = 1e-5; scheduler sigmas atol 1e-7, timesteps 1e-4, Euler steps
// 1e-6; helpers exact.
#ifndef DRAY_WORKERS_PARITY_QWEN_IMAGE_PARITY_H_
#define DRAY_WORKERS_PARITY_QWEN_IMAGE_PARITY_H_

#include <string>
#include <vector>

#include "workers/parity/parity_case.h"

namespace dray::qwen_image {

// QwenImageParityCases lists the cases of one component folder, sorted by
// name (none if the folder is not a component).
std::vector<ParityCase> QwenImageParityCases(const std::string& folder);

}  // namespace dray::qwen_image

#endif  // DRAY_WORKERS_PARITY_QWEN_IMAGE_PARITY_H_
