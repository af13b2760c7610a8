// Where the diffusers reference vectors (../shared/reference, see its README)
// are in a test's runfiles. A checkout without them builds; the tests that
// need them skip, saying why:
//
//   TEST(X, Y) {
//     DRAY_SKIP_WITHOUT_REFERENCE();
//     ... ReferencePath("vae_tiny/config.json") ...
#ifndef DRAY_TESTS_MODELS_REFERENCE_H_
#define DRAY_TESTS_MODELS_REFERENCE_H_

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"

namespace dray {

// ReferencePath returns the path of `file` below reference/qwen_image/.
inline std::string ReferencePath(const std::string& file) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/shared_reference/qwen_image/", file);
}

// HaveReference is true when the reference vectors are present.
inline bool HaveReference() { return std::filesystem::exists(ReferencePath("README.md")); }

}  // namespace dray

#define DRAY_SKIP_WITHOUT_REFERENCE()                                                       \
  do {                                                                                      \
    if (!::dray::HaveReference()) GTEST_SKIP() << "no reference vectors in ../shared/reference"; \
  } while (false)

#endif  // DRAY_TESTS_MODELS_REFERENCE_H_
