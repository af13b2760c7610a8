// Parity with diffusers' QwenImageEditPlusPipeline (Qwen-Image-Edit-2509 and
// -2511): the cases of a folder laid out like
// tests/data/reference/qwen_image_edit_plus (see its README), run through
// dray's edit pipeline on the model directory beside them (`../model`).
//
// A folder is recognized by its name beside such a model:
//   preprocess/     sizes, resized images (crops and channel sums), prompt
//                   ids and image grids at the released sizes (384^2 for the
//                   text encoder, 1024^2 for the VAE and the output)
//                   (component "edit_plus_preprocess")
//   encode_prompt/  the prompt states with one to three images, and a padded
//                   text-only batch (component "edit_plus_encode_prompt")
//   e2e_plus/       whole edits: prompt states, image latents, the noise
//                   from the case's seed, each step's predictions and
//                   latents, the decoded image (component "edit_plus_e2e")
//   e2e_edit/       the same for diffusers' QwenImageEditPipeline (one
//                   picture, Qwen-Image-Edit) on that model (component
//                   "edit_e2e")
//
//   for (const ParityCase& c : EditPlusParityCases("reference/qwen_image_edit_plus/e2e_plus")) ...
//
// Tolerances are the README's: sizes, ids, grids, masks and resized pixels
// exact; prompt states, latents, predictions and the decoded image
// atol = rtol = 1e-5.
#ifndef DRAY_WORKERS_PARITY_EDIT_PLUS_PARITY_H_
#define DRAY_WORKERS_PARITY_EDIT_PLUS_PARITY_H_

#include <string>
#include <vector>

#include "workers/parity/parity_case.h"

namespace dray::qwen_image {

// EditPlusParityCases lists the cases of one folder, sorted by name (none if
// the folder is not one of the above).
std::vector<ParityCase> EditPlusParityCases(const std::string& folder);

}  // namespace dray::qwen_image

#endif  // DRAY_WORKERS_PARITY_EDIT_PLUS_PARITY_H_
