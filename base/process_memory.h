// What this process holds in memory, for reports and metrics.
#ifndef DRAY_BASE_PROCESS_MEMORY_H_
#define DRAY_BASE_PROCESS_MEMORY_H_

#include <cstdint>

namespace dray {

// ResidentBytes: this process's resident memory (RSS), from /proc/self/statm.
int64_t ResidentBytes();

}  // namespace dray

#endif  // DRAY_BASE_PROCESS_MEMORY_H_
