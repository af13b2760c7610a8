#include "runtime/bench/cpu_memory_counter.h"

#include <ATen/ATen.h>

#include <thread>

#include "gtest/gtest.h"

namespace dray {
namespace {

TEST(CpuMemoryCounterTest, CountsTensorStorageExactly) {
  CpuMemoryCounter& counter = InstallCpuMemoryCounter();
  EXPECT_EQ(&counter, &InstallCpuMemoryCounter());
  const int64_t before = counter.current();
  counter.ResetPeak();
  {
    const at::Tensor a = at::empty({1000}, at::kFloat);
    EXPECT_EQ(counter.current() - before, 4000);
    { const at::Tensor b = at::ones({500}, at::kDouble); }
    EXPECT_EQ(counter.current() - before, 4000);
    EXPECT_EQ(counter.peak() - before, 8000);
    // CPU BLAS takes its workspace through raw_allocate.
    EXPECT_TRUE(
        at::allclose(at::mm(at::ones({64, 64}), at::ones({64, 64})), at::full({64, 64}, 64.0)));
  }
  EXPECT_EQ(counter.current(), before);
}

TEST(CpuMemoryCounterTest, ChargesRanksTheirOwnAndAShareOfTheRest) {
  CpuMemoryCounter& counter = InstallCpuMemoryCounter();
  counter.SplitIntoRanks(2);
  at::Tensor kept[2];
  std::thread ranks[2];
  for (int rank = 0; rank < 2; ++rank) {
    ranks[rank] = std::thread([&kept, rank] {
      CpuMemoryCounter::CountThisThreadAsRank(rank);
      kept[rank] = at::empty({(rank + 1) * 1000}, at::kByte);
    });
  }
  for (std::thread& rank : ranks) rank.join();
  EXPECT_EQ(counter.RankCurrent(0), 1000);
  EXPECT_EQ(counter.RankCurrent(1), 2000);
  {
    const at::Tensor shared = at::empty({600}, at::kByte);  // this thread is no rank's
    EXPECT_EQ(counter.RankCurrent(0), 1300);
  }
  EXPECT_EQ(counter.RankPeak(0), 1300);
  EXPECT_EQ(counter.RankPeak(1), 2300);
  kept[1] = at::Tensor();  // freed by another thread: still rank 1's
  EXPECT_EQ(counter.RankCurrent(1), 0);
  counter.ResetPeak();
  EXPECT_EQ(counter.RankPeak(1), 0);
}

}  // namespace
}  // namespace dray
