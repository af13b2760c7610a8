#include "base/exception_message.h"

#include <c10/util/Exception.h>

#include <stdexcept>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dray {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ExceptionMessageTest, DropsLibTorchsBacktrace) {
  try {
    TORCH_CHECK(false, "shapes differ: 3 vs 4");
  } catch (const std::exception& e) {
    ASSERT_THAT(e.what(), HasSubstr("Exception raised from"));  // what() carries the trace
    EXPECT_THAT(ExceptionMessage(e), HasSubstr("shapes differ: 3 vs 4"));
    EXPECT_THAT(ExceptionMessage(e), Not(HasSubstr("Exception raised from")));
    EXPECT_THAT(ExceptionMessage(e), Not(HasSubstr(".cpp")));
  }
  EXPECT_EQ(ExceptionMessage(std::runtime_error("broke")), "broke");
}

}  // namespace
}  // namespace dray
