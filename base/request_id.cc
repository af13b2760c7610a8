#include "base/request_id.h"

#include <cstdint>

#include "absl/random/random.h"
#include "absl/strings/str_format.h"

namespace dray {

std::string NewRequestId() {
  thread_local absl::BitGen random;
  return absl::StrFormat("%016x", absl::Uniform<uint64_t>(random));
}

}  // namespace dray
