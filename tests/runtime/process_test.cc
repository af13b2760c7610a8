// Tests that watch a controller process from outside: its workers' output
// reaches it prefixed by rank, and killing it leaves no orphan workers and
// no shared memory.
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/runtime/test_util.h"

namespace dray {
namespace {

using ::testing::HasSubstr;

std::string ControllerCommand(const std::string& mode) {
  return absl::StrCat(RunfilePath("tests/runtime/test_controller"), " ", mode, " ",
                      RunfilePath("tests/runtime/test_workers"), " 2>&1");
}

TEST(ControllerProcessTest, WorkerOutputIsPrefixedWithItsRank) {
  FILE* controller = popen(ControllerCommand("print").c_str(), "r");
  ASSERT_NE(controller, nullptr);
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), controller)) output.append(buffer, n);
  EXPECT_EQ(pclose(controller), 0) << output;
  for (int rank : {0, 1}) {
    EXPECT_THAT(output, HasSubstr(absl::StrCat("[rank ", rank, "] hello from stdout\n")));
    EXPECT_THAT(output, HasSubstr(absl::StrCat("[rank ", rank, "] hello from stderr\n")));
  }
}

// SharedMemoryFiles lists dray's files in /dev/shm (other programs' come and
// go as they please).
std::set<std::string> SharedMemoryFiles() {
  std::set<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename();
    if (name.find("dray") != std::string::npos) files.insert(name);
  }
  return files;
}

TEST(ControllerProcessTest, KillingTheControllerLeavesNoOrphans) {
  const std::set<std::string> shared_before = SharedMemoryFiles();
  FILE* controller = popen(ControllerCommand("hold").c_str(), "r");
  ASSERT_NE(controller, nullptr);
  pid_t controller_pid = -1;
  std::vector<pid_t> workers;
  char line[256];
  while (fgets(line, sizeof(line), controller) != nullptr) {
    int pid;
    if (std::sscanf(line, "controller %d", &pid) == 1) controller_pid = pid;
    if (std::sscanf(line, "worker %d", &pid) == 1) workers.push_back(pid);
    if (std::string(line) == "ready\n") break;
  }
  ASSERT_GT(controller_pid, 0);
  ASSERT_EQ(workers.size(), 2u);
  for (pid_t pid : workers) ASSERT_TRUE(ProcessAlive(pid));

  // Exit events of processes that are not our children, as pidfds give them.
  std::vector<int> exits;
  for (pid_t pid : workers) {
    exits.push_back(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
    ASSERT_GE(exits.back(), 0) << "pidfd_open(" << pid << ")";
  }
  ASSERT_EQ(kill(controller_pid, SIGKILL), 0);
  for (size_t i = 0; i < workers.size(); ++i) {
    pollfd exited{exits[i], POLLIN, 0};
    EXPECT_EQ(poll(&exited, 1, /*timeout_ms=*/60000), 1)
        << "worker " << workers[i] << " outlived its controller";
    close(exits[i]);
  }
  pclose(controller);
  // The payload segments held on both sides (memfds) were never files.
  EXPECT_EQ(SharedMemoryFiles(), shared_before);
}

}  // namespace
}  // namespace dray
