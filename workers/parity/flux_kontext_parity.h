// Parity with diffusers' FluxKontextPipeline and transformers' CLIP and T5
// encoders: the cases of a folder laid out like
// tests/data/reference/flux_kontext (see its README), run on the model
// directory beside them (`../model`, whose model_index.json names
// FluxKontextPipeline).
//
// A folder is recognized by its name beside such a model:
//   transformer/  one FluxTransformer2DModel call per case (component
//                 "flux_transformer")
//
//   for (const ParityCase& c : FluxKontextParityCases("reference/flux_kontext/transformer")) ...
//
// Tolerances are the README's: model outputs and latents atol 1e-4.
#ifndef DRAY_WORKERS_PARITY_FLUX_KONTEXT_PARITY_H_
#define DRAY_WORKERS_PARITY_FLUX_KONTEXT_PARITY_H_

#include <string>
#include <vector>

#include "workers/parity/parity_case.h"

namespace dray::flux {

// FluxKontextParityCases lists the cases of one folder, sorted by name
// (none if the folder is not one of the above).
std::vector<ParityCase> FluxKontextParityCases(const std::string& folder);

}  // namespace dray::flux

#endif  // DRAY_WORKERS_PARITY_FLUX_KONTEXT_PARITY_H_
