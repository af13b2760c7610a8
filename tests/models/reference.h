// Where the diffusers reference vectors (../shared/reference, see its README)
// are in a test's runfiles.
#ifndef DRAY_TESTS_MODELS_REFERENCE_H_
#define DRAY_TESTS_MODELS_REFERENCE_H_

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace dray {

// ReferencePath returns the path of `file` below reference/qwen_image/.
inline std::string ReferencePath(const std::string& file) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/shared_reference/qwen_image/", file);
}

}  // namespace dray

#endif  // DRAY_TESTS_MODELS_REFERENCE_H_
