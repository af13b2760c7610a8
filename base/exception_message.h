// ExceptionMessage: what an exception says, fit for an error that leaves the
// process. LibTorch's c10::Error appends a C++ backtrace (addresses, build
// paths) to what(); this returns the message without it.
//
//   } catch (const std::exception& e) {
//     return absl::InternalError(ExceptionMessage(e));
//   }
//
// Thread-safety: a stateless function.
#ifndef DRAY_BASE_EXCEPTION_MESSAGE_H_
#define DRAY_BASE_EXCEPTION_MESSAGE_H_

#include <exception>
#include <string>

namespace dray {

std::string ExceptionMessage(const std::exception& e);

}  // namespace dray

#endif  // DRAY_BASE_EXCEPTION_MESSAGE_H_
