// RankMemory: what one worker process held as it answered its last call
// (WorkerGroup::memory), for reports and metrics.
#ifndef DRAY_RUNTIME_CONTROLLER_RANK_MEMORY_H_
#define DRAY_RUNTIME_CONTROLLER_RANK_MEMORY_H_

#include <cstdint>

namespace dray {

struct RankMemory {
  bool known = false;  // false before its first answer
  int64_t resident_bytes = 0;
  int64_t device_allocated_bytes = 0;  // on its GPU; 0 without
};

}  // namespace dray

#endif  // DRAY_RUNTIME_CONTROLLER_RANK_MEMORY_H_
