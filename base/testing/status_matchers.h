// GoogleTest helpers for absl::Status, which Debian's Abseil 20220623 lacks.
//
//   EXPECT_THAT(Parse("x"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("x")));
//   DRAY_ASSERT_OK_AND_ASSIGN(DataProto batch, DataProto::Make(...));
//   DRAY_ASSERT_OK(batch.AddTensor("a", t));
#ifndef DRAY_BASE_TESTING_STATUS_MATCHERS_H_
#define DRAY_BASE_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dray::testing {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }

template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

// StatusIs matches a Status or StatusOr whose code is `code` and whose message
// matches `message_matcher`.
MATCHER_P2(StatusIs, code, message_matcher,
           std::string("has status code ") + absl::StatusCodeToString(code)) {
  const absl::Status& status = GetStatus(arg);
  *result_listener << "whose status is " << status;
  return status.code() == code &&
         ::testing::ExplainMatchResult(message_matcher, std::string(status.message()),
                                       result_listener);
}

// StatusIs(code) matches any message.
inline auto StatusIs(absl::StatusCode code) { return StatusIs(code, ::testing::_); }

// IsOk matches an OK Status or StatusOr.
MATCHER(IsOk, "is OK") {
  const absl::Status& status = GetStatus(arg);
  *result_listener << "whose status is " << status;
  return status.ok();
}

}  // namespace dray::testing

namespace dray {

// PrintTo shows a StatusOr holding dray's types in a test failure: its
// status, or its value as GoogleTest prints it. (Newer Abseil prints a
// StatusOr<T> with T's operator<<, which c10's logging header declares for
// every std::vector, and fails to compile where the elements have none.)
template <typename T>
void PrintTo(const absl::StatusOr<T>& result, std::ostream* out) {
  if (!result.ok()) {
    *out << result.status();
    return;
  }
  *out << ::testing::PrintToString(*result);
}

}  // namespace dray

#define DRAY_ASSERT_OK(expr) ASSERT_THAT((expr), ::dray::testing::IsOk())
#define DRAY_EXPECT_OK(expr) EXPECT_THAT((expr), ::dray::testing::IsOk())

// DRAY_ASSERT_OK_AND_ASSIGN(lhs, rexpr): asserts that `rexpr` (a StatusOr) is
// OK and moves its value into `lhs`.
#define DRAY_ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  DRAY_ASSERT_OK_AND_ASSIGN_IMPL_(DRAY_TEST_CONCAT_(dray_test_statusor_, __LINE__), lhs, rexpr)
#define DRAY_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                    \
  ASSERT_TRUE(statusor.ok()) << statusor.status();            \
  lhs = std::move(statusor).value()
#define DRAY_TEST_CONCAT_INNER_(a, b) a##b
#define DRAY_TEST_CONCAT_(a, b) DRAY_TEST_CONCAT_INNER_(a, b)

#endif  // DRAY_BASE_TESTING_STATUS_MATCHERS_H_
