#include "runtime/bench/cpu_memory_counter.h"

#include <algorithm>
#include <new>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/alignment.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include "base/libtorch_compat.h"

namespace dray {
namespace {

thread_local int this_thread_rank = -1;

// kHeader: room before each block for what to uncount when it is freed,
// keeping the data at LibTorch's CPU alignment.
constexpr size_t kHeader = c10::gAlignment;

struct Header {
  int64_t bytes;
  CpuMemoryCounter* counter;
  int rank;
};
static_assert(sizeof(Header) <= kHeader, "the header must fit its room");

// RaiseTo makes `peak` at least `value`.
void RaiseTo(std::atomic<int64_t>& peak, int64_t value) {
  int64_t seen = peak.load();
  while (value > seen && !peak.compare_exchange_weak(seen, value)) {
  }
}

// CountingAllocator allocates as LibTorch's default CPU allocator does
// (c10::alloc_cpu), behind a header. The data pointer is its own context,
// so raw_allocate works too (CPU BLAS asks for its workspace that way).
class CountingAllocator : public CpuAllocator {
 public:
  explicit CountingAllocator(CpuMemoryCounter* counter) : counter_(counter) {}

  c10::DataPtr Allocate(size_t bytes) const override {
    char* block = static_cast<char*>(c10::alloc_cpu(bytes + kHeader));
    new (block) Header{static_cast<int64_t>(bytes), counter_, this_thread_rank};
    counter_->Allocated(static_cast<int64_t>(bytes), this_thread_rank);
    void* data = block + kHeader;
    return {data, data, &Free, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &Free; }

 private:
  static void Free(void* data) {
    char* block = static_cast<char*>(data) - kHeader;
    const Header* header = reinterpret_cast<const Header*>(block);
    header->counter->Freed(header->bytes, header->rank);
    c10::free_cpu(block);
  }

  CpuMemoryCounter* counter_;
};

}  // namespace

void CpuMemoryCounter::ResetPeak() {
  peak_.store(current_.load());
  for (int rank = 0; rank < ranks_.load(); ++rank) rank_peaks_[rank].store(RankCurrent(rank));
}

void CpuMemoryCounter::SplitIntoRanks(int ranks) {
  TORCH_CHECK(ranks >= 0 && ranks <= kMaxRanks, "SplitIntoRanks: ", ranks, " ranks, at most ",
              kMaxRanks);
  ranks_.store(0);  // uncounted while the tallies restart
  unranked_.store(0);
  for (int rank = 0; rank < kMaxRanks; ++rank) {
    rank_currents_[rank].store(0);
    rank_peaks_[rank].store(0);
  }
  ranks_.store(ranks);
}

void CpuMemoryCounter::CountThisThreadAsRank(int rank) { this_thread_rank = rank; }

int64_t CpuMemoryCounter::RankCurrent(int rank) const {
  return rank_currents_[rank].load() + unranked_.load() / std::max(1, ranks_.load());
}

void CpuMemoryCounter::RaiseRankPeak(int rank) { RaiseTo(rank_peaks_[rank], RankCurrent(rank)); }

void CpuMemoryCounter::Allocated(int64_t bytes, int rank) {
  RaiseTo(peak_, current_.fetch_add(bytes) + bytes);
  const int ranks = ranks_.load();
  if (rank >= 0 && rank < ranks) {
    rank_currents_[rank].fetch_add(bytes);
    RaiseRankPeak(rank);
  } else if (ranks > 0) {
    unranked_.fetch_add(bytes);
    for (int r = 0; r < ranks; ++r) RaiseRankPeak(r);
  }
}

void CpuMemoryCounter::Freed(int64_t bytes, int rank) {
  current_.fetch_sub(bytes);
  const int ranks = ranks_.load();
  if (rank >= 0 && rank < ranks) {
    rank_currents_[rank].fetch_sub(bytes);
  } else if (ranks > 0) {
    unranked_.fetch_sub(bytes);
  }
}

CpuMemoryCounter& InstallCpuMemoryCounter() {
  static CpuMemoryCounter* const counter = [] {
    // Both live as long as the tensors they count: never destroyed.
    auto* installed = new CpuMemoryCounter;
    c10::SetCPUAllocator(new CountingAllocator(installed));
    return installed;
  }();
  return *counter;
}

}  // namespace dray
