#include "base/files.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

TEST(FilesTest, WritesAndReadsBackAnyBytes) {
  const std::string path = TempPath("bytes");
  std::string bytes(200000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7);
  DRAY_ASSERT_OK(WriteFile(path, bytes));
  DRAY_ASSERT_OK_AND_ASSIGN(std::string read, ReadFile(path));
  EXPECT_EQ(read, bytes);
  DRAY_ASSERT_OK(WriteFile(path, "short"));
  EXPECT_EQ(ReadFile(path).value(), "short");
}

TEST(FilesTest, ErrorsNameThePathAndTheReason) {
  EXPECT_THAT(
      ReadFile(TempPath("missing")),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("cannot read " + TempPath("missing"))));
  EXPECT_THAT(WriteFile(TempPath("no/such/dir/file"), "x"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("No such file or directory")));
}

}  // namespace
}  // namespace dray
