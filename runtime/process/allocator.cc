#include "runtime/process/allocator.h"

#include <malloc.h>

namespace dray {

void KeepFreedMemoryForReuse() {
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace dray
