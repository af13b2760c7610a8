#include "base/log.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dray {
namespace {

// CapturedStderr: what Log wrote to stderr while `run` ran.
template <typename Run>
std::string CapturedStderr(Run run) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/stderr");
  std::FILE* file = std::fopen(path.c_str(), "w");
  const int saved = dup(STDERR_FILENO);
  dup2(fileno(file), STDERR_FILENO);
  run();
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::fclose(file);
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(LogTest, WritesOneLineNamingWhoSpeaks) {
  EXPECT_EQ(CapturedStderr([] { Log("controller", "node a attached"); }),
            "dray controller: node a attached\n");
}

TEST(LogTest, LinesFromManyThreadsNeverInterleave) {
  constexpr int kThreads = 8, kLines = 200;
  const std::string text = CapturedStderr([] {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([t] {
        for (int i = 0; i < kLines; ++i) Log(absl::StrCat("rank ", t), std::string(100, 'a' + t));
      });
    }
    for (std::thread& thread : threads) thread.join();
  });
  std::istringstream lines(text);
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) {
    ++count;
    ASSERT_EQ(line.size(), std::string("dray rank 0: ").size() + 100) << line;
    const int t = line[10] - '0';
    EXPECT_EQ(line, absl::StrCat("dray rank ", t, ": ", std::string(100, 'a' + t)));
  }
  EXPECT_EQ(count, kThreads * kLines);
}

}  // namespace
}  // namespace dray
