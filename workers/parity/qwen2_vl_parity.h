// Parity with transformers: the Qwen2.5-VL reference cases of a folder laid
// out like tests/data/reference/qwen2_vl (see its README), run through dray.
//
// A folder is recognized by content:
//   a model       config.json with model_type qwen2_5_vl, its weights, and
//                 case_*.safetensors: text-only, vision-only and multimodal
//                 batches (component "text_encoder_<folder>")
//   a processor   preprocessor_config.json of a Qwen2VLImageProcessor and
//                 case_*.safetensors (component "image_processor")
//
//   for (const ParityCase& c : Qwen2VlParityCases("reference/qwen2_vl/tiny")) ...
//
// Tolerances are the reference README's: hidden states, logits, input and
// image embeddings atol = rtol = 1e-5, compared where the attention mask is
// 1 (what a padded query computes is each implementation's own); position
// ids, rope deltas, grids, window order and lengths, sizes and the resized
// pixels exact; pixel values 1e-6.
#ifndef DRAY_WORKERS_PARITY_QWEN2_VL_PARITY_H_
#define DRAY_WORKERS_PARITY_QWEN2_VL_PARITY_H_

#include <string>
#include <vector>

#include "workers/parity/parity_case.h"

namespace dray::qwen2_vl {

// Qwen2VlParityCases lists the cases of one folder, sorted by name (none if
// the folder is neither a model nor a processor folder).
std::vector<ParityCase> Qwen2VlParityCases(const std::string& folder);

}  // namespace dray::qwen2_vl

#endif  // DRAY_WORKERS_PARITY_QWEN2_VL_PARITY_H_
