// Status propagation helpers for dray (Debian's Abseil 20220623 has no
// ABSL_RETURN_IF_ERROR / ABSL_ASSIGN_OR_RETURN).
//
//   absl::StatusOr<int> Parse(absl::string_view text);
//
//   absl::Status Use(absl::string_view text) {
//     DRAY_ASSIGN_OR_RETURN(int value, Parse(text));
//     DRAY_RETURN_IF_ERROR(Check(value));
//     return absl::OkStatus();
//   }
#ifndef DRAY_BASE_STATUS_MACROS_H_
#define DRAY_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// DRAY_RETURN_IF_ERROR returns the status of `expr` from the calling function
// when it is not OK.
#define DRAY_RETURN_IF_ERROR(expr)               \
  do {                                           \
    const absl::Status dray_status_ = (expr);    \
    if (!dray_status_.ok()) return dray_status_; \
  } while (false)

// DRAY_ASSIGN_OR_RETURN evaluates `rexpr` (an absl::StatusOr<T>); on error it
// returns the status, otherwise it moves the value into `lhs`, which may
// declare a variable: DRAY_ASSIGN_OR_RETURN(auto x, Make());
#define DRAY_ASSIGN_OR_RETURN(lhs, rexpr) \
  DRAY_ASSIGN_OR_RETURN_IMPL_(DRAY_CONCAT_(dray_statusor_, __LINE__), lhs, rexpr)

#define DRAY_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr)  \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#define DRAY_CONCAT_INNER_(a, b) a##b
#define DRAY_CONCAT_(a, b) DRAY_CONCAT_INNER_(a, b)

#endif  // DRAY_BASE_STATUS_MACROS_H_
