// Allocator settings for processes that move large batches.
//
// glibc serves allocations above 32 MiB (and, in thread arenas, far smaller
// ones) with fresh mmap'd pages and unmaps them on free, so every batch-sized
// buffer page-faults anew: measured here, a 50 MB copy into a fresh buffer
// runs at 2.2 GB/s, into reused memory at 8.6-14 GB/s. A batch is copied
// several times on its way (encode, gRPC, decode), so this dominated
// DP_COMPUTE_PROTO bandwidth.
//
// KeepFreedMemoryForReuse makes freed memory stay in the process for the
// next batch: one arena, no mmap for large blocks, and only free space above
// 1 GiB at the top of the heap is returned to the system. The cost is a
// higher resident size after a peak. Call it at the start of main().
#ifndef DRAY_RUNTIME_PROCESS_ALLOCATOR_H_
#define DRAY_RUNTIME_PROCESS_ALLOCATOR_H_

namespace dray {

void KeepFreedMemoryForReuse();

}  // namespace dray

#endif  // DRAY_RUNTIME_PROCESS_ALLOCATOR_H_
