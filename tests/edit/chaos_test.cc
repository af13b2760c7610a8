// A bounded chaos test of the image-edit service: clients send a mix of good
// and bad requests while workers are killed or stopped at random. Every
// request must get an answer (a result, or an error its kind documents),
// memory must stay bounded, the service must serve again afterwards, and
// every worker process ever started must be reaped.
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/testing/status_matchers.h"
#include "dray/v1/image_edit.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/rpc/grpc_util.h"
#include "tests/edit/edit_test_util.h"
#include "tests/edit/serving.h"
#include "tests/runtime/test_util.h"

namespace dray {
namespace {

using ::grpc::health::v1::HealthCheckResponse;
using Code = absl::StatusCode;

constexpr int kClients = 3;
constexpr int kRequestsPerClient = 48;
constexpr int kEditsBetweenBlows = 3;  // the chaos strikes after each this many edits
constexpr int kMaxBlows = 8;           // restart backoffs double: 10 ms ... 1.3 s
constexpr int64_t kWorkerMemoryLimit = int64_t{2} << 30;
constexpr int64_t kControllerGrowthLimit = int64_t{300} << 20;

// ChaosRequest: one request and the answers its kind may get. UNAVAILABLE
// is always allowed: admission refuses everything while the workers restart.
struct ChaosRequest {
  std::string kind;
  v1::EditImageRequest request;
  absl::Duration timeout = absl::Minutes(2);
  std::set<Code> allowed;
};

ChaosRequest MakeRequest(int index) {
  ChaosRequest chaos;
  chaos.request = Request(index % 3, index);
  switch (index % 6) {
    case 0:
      chaos.kind = "good";
      chaos.allowed = {Code::kOk};
      break;
    case 1:
      chaos.kind = "not UTF-8";
      chaos.request.set_instruction("make it \xff\xfe blue");
      chaos.allowed = {Code::kInvalidArgument};
      break;
    case 2:
      chaos.kind = "too many pixels";
      chaos.request.set_width(2048);
      chaos.request.set_height(2048);
      chaos.allowed = {Code::kInvalidArgument};
      break;
    case 3:
      chaos.kind = "not an image";
      chaos.request.set_image("GIF89a, or so it says");
      chaos.allowed = {Code::kInvalidArgument};
      break;
    case 4:
      chaos.kind = "deadline far too short";
      chaos.request.set_num_inference_steps(1000);
      chaos.timeout = absl::Milliseconds(300);
      chaos.allowed = {Code::kDeadlineExceeded};
      break;
    default:
      chaos.kind = "good, longer";
      chaos.request.set_num_inference_steps(20);
      chaos.allowed = {Code::kOk};
      break;
  }
  chaos.allowed.insert(Code::kUnavailable);
  return chaos;
}

// ResidentBytes: VmRSS of process `pid` ("self" for this one); 0 once gone.
int64_t ResidentBytes(const std::string& pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string key;
  int64_t kib = 0;
  while (status >> key) {
    if (key == "VmRSS:" && status >> kib) return kib * 1024;
  }
  return 0;
}

// Chaos strikes the serving workers while the clients run.
class Chaos {
 public:
  explicit Chaos(Serving* serving) : serving_(serving) {}

  // Edited counts one successful edit; the chaos strikes after every
  // kEditsBetweenBlows of them, so that the service edits between blows.
  void Edited() {
    absl::MutexLock lock(&mu_);
    ++edited_;
  }
  void ClientsDone() {
    absl::MutexLock lock(&mu_);
    clients_done_ = true;
  }

  // Run strikes until the clients are done: after each few edits it kills
  // or stops one worker at random.
  void Run() {
    std::mt19937 random(20261123);
    for (int next = kEditsBetweenBlows;; next += kEditsBetweenBlows) {
      {
        absl::MutexLock lock(&mu_);
        auto woken = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return clients_done_ || edited_ >= next;
        };
        mu_.Await(absl::Condition(&woken));
        if (clients_done_) return;
        if (blows_ == kMaxBlows) continue;
      }
      Strike(random);
    }
  }

  int blows() const { return blows_; }
  const std::set<pid_t>& workers_seen() const { return workers_seen_; }
  int64_t max_worker_bytes() const { return max_worker_bytes_; }

  // Note records the current group's workers and their memory.
  void Note() {
    std::shared_ptr<WorkerGroup> group = serving_->controller->group();
    if (group == nullptr) return;
    for (pid_t pid : group->pids()) {
      workers_seen_.insert(pid);
      max_worker_bytes_ = std::max(max_worker_bytes_, ResidentBytes(std::to_string(pid)));
    }
  }

 private:
  // Strike kills or stops one worker, then waits for the service to heal
  // (NOT_SERVING, then SERVING), so that each blow strikes a serving group.
  void Strike(std::mt19937& random) {
    Note();
    HealthWatch health(*serving_);
    const std::vector<pid_t> pids = serving_->controller->group()->pids();
    const pid_t victim = pids[random() % pids.size()];
    const int signal = random() % 2 == 0 ? SIGKILL : SIGSTOP;
    std::fprintf(stderr, "chaos: %s worker %d\n", signal == SIGKILL ? "killing" : "stopping",
                 victim);
    ASSERT_EQ(kill(victim, signal), 0);
    ++blows_;
    ASSERT_TRUE(health.WaitFor(HealthCheckResponse::NOT_SERVING));
    ASSERT_TRUE(health.WaitFor(HealthCheckResponse::SERVING));
  }

  Serving* const serving_;
  int blows_ = 0;
  std::set<pid_t> workers_seen_;
  int64_t max_worker_bytes_ = 0;
  absl::Mutex mu_;
  int edited_ ABSL_GUARDED_BY(mu_) = 0;
  bool clients_done_ ABSL_GUARDED_BY(mu_) = false;
};

TEST(ChaosTest, EveryRequestIsAnsweredWhileWorkersDieAndStall) {
  Serving serving = Serve(TestConfig(), {}, QuickHealing(1000));
  ASSERT_TRUE(HealthWatch(serving).WaitFor(HealthCheckResponse::SERVING));
  const int64_t controller_baseline = ResidentBytes("self");

  Chaos chaos(&serving);
  chaos.Note();
  std::thread striker([&] { chaos.Run(); });
  absl::Mutex mu;
  std::map<std::string, std::map<Code, int>> answers;  // by kind, then code
  std::vector<std::string> unexpected;
  std::vector<std::thread> clients;
  for (int client = 0; client < kClients; ++client) {
    clients.emplace_back([&, client] {
      for (int i = 0; i < kRequestsPerClient; ++i) {
        const ChaosRequest chaos_request = MakeRequest(i * kClients + client);  // kinds interleave
        const absl::Status status =
            Edit(serving, chaos_request.request, chaos_request.timeout).status();
        if (status.ok()) chaos.Edited();
        {
          absl::MutexLock lock(&mu);
          ++answers[chaos_request.kind][status.code()];
          if (chaos_request.allowed.count(status.code()) == 0)
            unexpected.push_back(absl::StrCat(chaos_request.kind, ": ", status.ToString()));
        }
        // As a client that retries would, wait for the service to heal.
        if (status.code() == Code::kUnavailable)
          HealthWatch(serving).WaitFor(HealthCheckResponse::SERVING);
      }
    });
  }
  for (std::thread& client : clients) client.join();
  chaos.ClientsDone();
  striker.join();

  for (const auto& [kind, codes] : answers) {
    for (const auto& [code, count] : codes)
      std::fprintf(stderr, "%s: %d x %s\n", kind.c_str(), count,
                   absl::StatusCodeToString(code).c_str());
  }
  EXPECT_THAT(unexpected, ::testing::IsEmpty());
  EXPECT_GT(chaos.blows(), 0);
  EXPECT_GT(answers["good"][Code::kOk], 0) << "nothing was edited between the blows";

  // The service has healed from the last blow (Strike waited): it serves,
  // and memory stayed bounded.
  DRAY_EXPECT_OK(Edit(serving, Request(0, 1)).status());
  EXPECT_GE(serving.controller->restarts(), chaos.blows());
  chaos.Note();
  std::fprintf(stderr, "%d blows; workers peaked at %lld MiB; the controller grew %lld MiB\n",
               chaos.blows(), static_cast<long long>(chaos.max_worker_bytes() >> 20),
               static_cast<long long>((ResidentBytes("self") - controller_baseline) >> 20));
  EXPECT_LT(chaos.max_worker_bytes(), kWorkerMemoryLimit);
  EXPECT_LT(ResidentBytes("self") - controller_baseline, kControllerGrowthLimit);

  serving.server->Shutdown();
  serving.controller.reset();
  for (pid_t pid : chaos.workers_seen()) EXPECT_TRUE(Reaped(pid)) << pid;
}

}  // namespace
}  // namespace dray
