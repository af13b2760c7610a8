// Several hosts on one machine: each "host" is a network namespace with its
// own address and hostname (netns_hosts.sh) running a node agent
// (test_node); the controller is this test, on the hosts' network. Real
// processes, real gRPC, real Gloo across the namespaces. Needs root (as CI
// has); skips without it.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "runtime/controller/node_pool.h"
#include "runtime/controller/worker_group.h"
#include "runtime/process/subprocess.h"
#include "runtime/security/job_secret.h"
#include "tests/runtime/test_util.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kSubnet[] = "10.77.31";

// Hosts runs netns_hosts.sh with `args` and waits for it.
absl::Status Hosts(const std::vector<std::string>& args) {
  SubprocessOptions script;
  script.argv = {"/bin/bash", RunfilePath("tests/cluster/netns_hosts.sh")};
  script.argv.insert(script.argv.end(), args.begin(), args.end());
  DRAY_ASSIGN_OR_RETURN(auto process, Subprocess::Spawn(script));
  std::optional<ExitStatus> status = process->WaitFor(absl::Minutes(1));
  if (!status.has_value() || status->exit_code != 0) {
    return absl::InternalError(absl::StrCat("netns_hosts.sh ", args[0], " failed"));
  }
  return absl::OkStatus();
}

// WaitForExit waits up to `timeout` for `pid` (not a child) to end.
bool WaitForExit(pid_t pid, absl::Duration timeout) {
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return true;  // already gone
  pollfd exited{fd, POLLIN, 0};
  const bool ended = poll(&exited, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) == 1;
  close(fd);
  return ended;
}

class MultiNodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root: network namespaces stand in for hosts";
    // One name per subnet: a run cleans up what a killed run left behind,
    // and waits for one still running (--runs_per_test).
    name_ = "drmn";
    lock_ = open(("/run/lock/dray-" + name_ + ".lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    ASSERT_GE(lock_, 0);
    ASSERT_EQ(flock(lock_, LOCK_EX), 0);
    DRAY_ASSERT_OK(Hosts({"up", name_, "2", kSubnet}));
    hosts_up_ = true;
    DRAY_ASSERT_OK_AND_ASSIGN(scratch_, ScratchDir::Create("multi-node"));
    token_ = NewJobSecret();
    token_file_ = scratch_->path() + "/token";
    DRAY_ASSERT_OK(WriteFile(token_file_, token_));
    NodePoolOptions options;
    options.listen = absl::StrCat(kSubnet, ".1:0");
    options.token = token_;
    DRAY_ASSERT_OK_AND_ASSIGN(pool_, NodePool::Start(options));
  }

  void TearDown() override {
    pool_.reset();  // tells the agents to stop
    for (auto& agent : agents_) agent->WaitFor(absl::Seconds(10));
    agents_.clear();
    if (hosts_up_) {
      DRAY_EXPECT_OK(Hosts({"down", name_, "2"}));
    }
    if (lock_ >= 0) close(lock_);
  }

  // StartAgent starts a node agent on host `host` (1 or 2), named nodeN,
  // with `extra` arguments.
  Subprocess* StartAgent(int host, const std::string& controller, const std::string& token_file,
                         const std::vector<std::string>& extra = {}) {
    SubprocessOptions agent;
    agent.argv = {"/usr/bin/nsenter",
                  absl::StrCat("--net=/run/netns/", name_, host),
                  "/usr/bin/unshare",
                  "--uts",
                  "/bin/sh",
                  "-c",
                  absl::StrCat("hostname node", host, " && exec \"$0\" \"$@\""),
                  RunfilePath("tests/cluster/test_node"),
                  absl::StrCat("--controller=", controller),
                  absl::StrCat("--token-file=", token_file),
                  absl::StrCat("--worker=", RunfilePath("tests/runtime/test_workers"))};
    agent.argv.insert(agent.argv.end(), extra.begin(), extra.end());
    agent.output_prefix = absl::StrCat("[agent ", host, "] ");
    auto started = Subprocess::Spawn(agent);
    DRAY_EXPECT_OK(started.status());
    if (!started.ok()) return nullptr;
    agents_.push_back(std::move(*started));
    return agents_.back().get();
  }

  void StartAgents() {
    for (int host : {1, 2}) StartAgent(host, pool_->address(), token_file_);
  }

  absl::StatusOr<std::unique_ptr<WorkerGroup>> StartGroup(ResourceSpec resources,
                                                          int first_gpu = 0) {
    WorkerGroupOptions options;
    options.first_gpu = first_gpu;
    options.roles = {"test"};
    options.nodes = pool_.get();
    options.register_timeout = absl::Seconds(60);
    return WorkerGroup::Create(resources, options);
  }

  // WaitForever starts a call on every rank that never ends by itself.
  static GroupFuture WaitForever(WorkerGroup& group) {
    return group.Invoke("wait_for_file",
                        {DataProto::Make({}, {}, {{"path", "/nonexistent/file"}}).value()});
  }

  std::string HostAddress(int host) const { return absl::StrCat(kSubnet, ".", 10 + host); }

  std::string name_;
  int lock_ = -1;  // held while this test owns the hosts
  bool hosts_up_ = false;
  std::optional<ScratchDir> scratch_;
  std::string token_;
  std::string token_file_;
  std::unique_ptr<NodePool> pool_;
  std::vector<std::unique_ptr<Subprocess>> agents_;
};

TEST_F(MultiNodeTest, RanksRunOnTheirNodesAndMeetAcrossThem) {
  StartAgents();
  DRAY_ASSERT_OK_AND_ASSIGN(auto group, StartGroup({2, 2}));

  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> identities, group->Call("identity", {}));
  ASSERT_EQ(identities.size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    const int host = 1 + rank / 2;
    const DataProto& identity = identities[rank];
    EXPECT_EQ(identity.GetMeta<int64_t>("rank").value(), rank);
    EXPECT_EQ(identity.GetMeta<int64_t>("local_rank").value(), rank % 2);
    EXPECT_EQ(identity.GetMeta<int64_t>("local_world_size").value(), 2);
    EXPECT_EQ(identity.GetMeta<std::string>("hostname").value(), absl::StrCat("node", host));
    EXPECT_EQ(identity.GetMeta<std::string>("node_addr").value(), HostAddress(host));
    EXPECT_EQ(identity.GetMeta<std::string>("master_addr").value(), HostAddress(1));
    EXPECT_EQ(identity.GetMeta<std::string>("store_file").value(), "");
  }
  for (const std::string& address : group->worker_addresses()) {
    EXPECT_THAT(address, HasSubstr(absl::StrCat(kSubnet, ".1"))) << "listens on its node only";
  }
  EXPECT_EQ(group->call_addresses(), group->worker_addresses()) << "other nodes: TCP";

  // DP_COMPUTE_PROTO: 8 rows split over the 4 ranks, in order.
  DRAY_ASSERT_OK_AND_ASSIGN(
      DataProto rows, DataProto::Make({}, {{"id", std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}}}));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> echoed, group->Call("echo", {rows}));
  ASSERT_EQ(echoed.size(), 1u);
  EXPECT_EQ(*echoed[0].GetRows<int64_t>("id").value(),
            (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(*echoed[0].GetRows<int64_t>("rank").value(),
            (std::vector<int64_t>{0, 0, 1, 1, 2, 2, 3, 3}));

  // A Gloo all-reduce across the namespaces: every rank gets 1 + 2 + 3 + 4.
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> sums, group->Call("all_reduce", {}));
  for (const DataProto& sum : sums) {
    EXPECT_EQ(sum.GetTensor("sum").value()[0][0].item<double>(), 10.0);
  }
}

TEST_F(MultiNodeTest, GroupsSharingNodesTakeDifferentGpus) {
  for (int host : {1, 2}) StartAgent(host, pool_->address(), token_file_, {"--gpus=4,6,7"});
  DRAY_ASSERT_OK_AND_ASSIGN(auto model, StartGroup({2, 1}));
  DRAY_ASSERT_OK_AND_ASSIGN(auto rewards, StartGroup({2, 2}, /*first_gpu=*/1));

  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> on_model, model->Call("identity", {}));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> on_rewards, rewards->Call("identity", {}));
  for (const DataProto& identity : on_model) {
    EXPECT_EQ(identity.GetMeta<std::string>("cuda_visible_devices").value(), "4");
  }
  for (const DataProto& identity : on_rewards) {
    const int64_t local_rank = identity.GetMeta<int64_t>("local_rank").value();
    EXPECT_EQ(identity.GetMeta<std::string>("cuda_visible_devices").value(),
              local_rank == 0 ? "6" : "7");
  }
  EXPECT_THAT(StartGroup({2, 2}, /*first_gpu=*/2).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("has 3 GPUs for 2 workers per node after the 2 that another "
                                 "group uses")));
}

TEST_F(MultiNodeTest, AGroupWaitsForItsNodesAndNamesThoseMissing) {
  StartAgents();
  WorkerGroupOptions options;
  options.roles = {"test"};
  options.nodes = pool_.get();
  options.register_timeout = absl::Seconds(3);
  DRAY_ASSERT_OK(pool_->WaitForNodes(2, absl::Seconds(60)).status());
  EXPECT_THAT(WorkerGroup::Create({3, 1}, options).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("1 of 3 nodes missing"),
                             HasSubstr(absl::StrCat("node1 (", HostAddress(1), ")")),
                             HasSubstr(absl::StrCat("node2 (", HostAddress(2), ")")))));
}

TEST_F(MultiNodeTest, AnAgentWithoutTheTokenIsTurnedAway) {
  const std::string wrong = scratch_->path() + "/wrong";
  DRAY_ASSERT_OK(WriteFile(wrong, "not the token"));
  Subprocess* agent = StartAgent(1, pool_->address(), wrong);
  ASSERT_NE(agent, nullptr);
  std::optional<ExitStatus> ended = agent->WaitFor(absl::Seconds(60));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->exit_code, 1);
  EXPECT_THAT(pool_->WaitForNodes(1, absl::ZeroDuration()).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST_F(MultiNodeTest, AKilledAgentFailsPendingCallsNamingItsNodeAndTakesItsWorkers) {
  StartAgents();
  DRAY_ASSERT_OK_AND_ASSIGN(auto group, StartGroup({2, 1}));
  const pid_t node2_worker = group->pids()[1];
  GroupFuture pending = WaitForever(*group);

  agents_[1]->Signal(SIGKILL);
  EXPECT_THAT(pending.Get().status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr(absl::StrCat("node2 (", HostAddress(2), ")")),
                             HasSubstr("rank 1"))));
  EXPECT_THAT(group->Health(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("node2")));
  EXPECT_TRUE(WaitForExit(node2_worker, absl::Seconds(30))) << "the worker outlived its agent";
}

TEST_F(MultiNodeTest, ACutNetworkFailsPendingCallsAndTheCutNodeKillsItsWorkers) {
  StartAgents();
  DRAY_ASSERT_OK_AND_ASSIGN(auto group, StartGroup({2, 1}));
  const pid_t node2_worker = group->pids()[1];
  GroupFuture pending = WaitForever(*group);

  DRAY_ASSERT_OK(Hosts({"cut", name_, "2"}));
  EXPECT_THAT(pending.Get().status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr(absl::StrCat("node2 (", HostAddress(2), ") was lost")),
                             HasSubstr("sent nothing for"))));
  // The cut-off agent hears nothing either: it kills its worker and gives up.
  std::optional<ExitStatus> agent = agents_[1]->WaitFor(absl::Seconds(60));
  ASSERT_TRUE(agent.has_value());
  EXPECT_EQ(agent->exit_code, 1);
  EXPECT_TRUE(WaitForExit(node2_worker, absl::Seconds(30)));
  DRAY_ASSERT_OK(Hosts({"mend", name_, "2"}));
}

TEST_F(MultiNodeTest, KillingTheControllerStopsEveryAgentAndWorker) {
  pool_.reset();  // this test's controller is another process
  const std::string command = absl::StrCat(RunfilePath("tests/runtime/test_controller"),
                                           " hold-on-nodes ", kSubnet, ".1:0 ", token_file_);
  FILE* controller = popen(command.c_str(), "r");
  ASSERT_NE(controller, nullptr);
  pid_t controller_pid = -1;
  std::vector<pid_t> workers;
  char line[256];
  while (fgets(line, sizeof(line), controller) != nullptr) {
    char address[128];
    int pid;
    if (std::sscanf(line, "pool %127s", address) == 1) {
      for (int host : {1, 2}) StartAgent(host, address, token_file_);
    }
    if (std::sscanf(line, "controller %d", &pid) == 1) controller_pid = pid;
    if (std::sscanf(line, "worker %d", &pid) == 1) workers.push_back(pid);
    if (std::string(line) == "ready\n") break;
  }
  ASSERT_GT(controller_pid, 0);
  ASSERT_EQ(workers.size(), 2u);

  ASSERT_EQ(kill(controller_pid, SIGKILL), 0);
  for (auto& agent : agents_) {
    std::optional<ExitStatus> ended = agent->WaitFor(absl::Seconds(60));
    ASSERT_TRUE(ended.has_value()) << "an agent outlived its controller";
    EXPECT_EQ(ended->exit_code, 1);
  }
  for (pid_t worker : workers) {
    EXPECT_TRUE(WaitForExit(worker, absl::Seconds(30))) << "worker " << worker << " outlived";
  }
  pclose(controller);
}

}  // namespace
}  // namespace dray
