// CpuMemoryCounter: how many bytes LibTorch's CPU tensors hold, now and at
// most, counted exactly at the allocator (no sampling, no resident-set
// guesses). InstallCpuMemoryCounter wraps LibTorch's default CPU allocator
// (c10::SetCPUAllocator), so every CPU tensor allocated from then on is
// counted when it is allocated and when its storage is freed; memory
// allocated before is never counted, even when freed later.
//
// For ranks run as threads of one process (RunLocalGroup) it also keeps
// each rank's own count: after SplitIntoRanks(n), a thread that called
// CountThisThreadAsRank(r) is charged what it allocates, and what threads
// of no rank allocate (a collective library's own buffers, on its worker
// threads) is shared, 1/n to each rank.
//
//   CpuMemoryCounter& counter = InstallCpuMemoryCounter();  // before building
//   counter.SplitIntoRanks(2);
//   RunLocalGroup(2, [&](int rank, Communicator* comm) {
//     CpuMemoryCounter::CountThisThreadAsRank(rank);
//     ... counter.ResetPeak(); Step(); peak = counter.RankPeak(rank); ...
//   });
//
// Only tensor storage is counted: what kernels allocate for themselves
// (oneDNN scratch pads, OpenBLAS buffers) is not, as a GPU's caching
// allocator does not see a library's workspace either.
//
// Thread-safe; the peaks of ranks are exact for each allocation, while
// allocations racing on several threads may each see the other's count a
// moment late.
#ifndef DRAY_RUNTIME_BENCH_CPU_MEMORY_COUNTER_H_
#define DRAY_RUNTIME_BENCH_CPU_MEMORY_COUNTER_H_

#include <array>
#include <atomic>
#include <cstdint>

namespace dray {

class CpuMemoryCounter {
 public:
  static constexpr int kMaxRanks = 64;

  // current: bytes allocated through the counter and not yet freed.
  int64_t current() const { return current_.load(); }
  // peak: the most `current` has been since installation or ResetPeak.
  int64_t peak() const { return peak_.load(); }
  // ResetPeak makes every peak (the process's, each rank's) its current count.
  void ResetPeak();

  // SplitIntoRanks starts `ranks` (<= kMaxRanks) rank counts at zero.
  // Memory a rank's thread allocated earlier must be freed before.
  void SplitIntoRanks(int ranks);
  // CountThisThreadAsRank charges the calling thread's allocations to
  // `rank` (-1: to no rank).
  static void CountThisThreadAsRank(int rank);
  // RankCurrent / RankPeak: a rank's bytes (its own and its share of the
  // unranked ones), now and at most since SplitIntoRanks or ResetPeak.
  int64_t RankCurrent(int rank) const;
  int64_t RankPeak(int rank) const { return rank_peaks_[rank].load(); }

  // Allocated and Freed record `bytes` of `rank` (-1: none); called by the allocator.
  void Allocated(int64_t bytes, int rank);
  void Freed(int64_t bytes, int rank);

 private:
  void RaiseRankPeak(int rank);

  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int> ranks_{0};
  std::atomic<int64_t> unranked_{0};
  std::array<std::atomic<int64_t>, kMaxRanks> rank_currents_{};
  std::array<std::atomic<int64_t>, kMaxRanks> rank_peaks_{};
};

// InstallCpuMemoryCounter makes LibTorch's CPU allocator count (once per
// process; later calls return the same counter).
CpuMemoryCounter& InstallCpuMemoryCounter();

}  // namespace dray

#endif  // DRAY_RUNTIME_BENCH_CPU_MEMORY_COUNTER_H_
