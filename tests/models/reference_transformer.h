// The reference transformers of tests/data/reference/qwen_image (diffusers'
// tiny and small configurations with their weights), built for a test.
//
//   DRAY_ASSERT_OK_AND_ASSIGN(qwen_image::QwenImageTransformer model,
//                             LoadReferenceTransformer("transformer_small"));
#ifndef DRAY_TESTS_MODELS_REFERENCE_TRANSFORMER_H_
#define DRAY_TESTS_MODELS_REFERENCE_TRANSFORMER_H_

#include <string>

#include "absl/status/statusor.h"
#include "workers/models/qwen_image/transformer.h"

namespace dray {

// LoadReferenceTransformer builds reference/qwen_image/`folder`'s
// transformer in float32, with Edit-2511's zero_cond_t modulation when
// `zero_cond_t` (the weights do not change with it).
absl::StatusOr<qwen_image::QwenImageTransformer> LoadReferenceTransformer(const std::string& folder,
                                                                          bool zero_cond_t = false);

}  // namespace dray

#endif  // DRAY_TESTS_MODELS_REFERENCE_TRANSFORMER_H_
