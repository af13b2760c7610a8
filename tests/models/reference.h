// Where the reference vectors (tests/data/reference/, copied from the
// reference implementations' own outputs; see each folder's README) are in a
// test's runfiles. They are part of the repository: a test that cannot find
// them fails, naming the path, rather than passing on nothing.
//
//   TEST(X, Y) {
//     ... ReferencePath("vae_tiny/config.json") ...
#ifndef DRAY_TESTS_MODELS_REFERENCE_H_
#define DRAY_TESTS_MODELS_REFERENCE_H_

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace dray {

// ReferenceDir returns the runfiles path of tests/data/reference/`folder`.
inline std::string ReferenceDir(const std::string& folder) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr || workspace == nullptr)
    return absl::StrCat("tests/data/reference/", folder);
  return absl::StrCat(srcdir, "/", workspace, "/tests/data/reference/", folder);
}

// ReferencePath returns the path of `file` below reference/qwen_image/.
inline std::string ReferencePath(const std::string& file) {
  return absl::StrCat(ReferenceDir("qwen_image"), "/", file);
}

}  // namespace dray

#endif  // DRAY_TESTS_MODELS_REFERENCE_H_
