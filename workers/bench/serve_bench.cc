#include "workers/bench/serve_bench.h"

#include <signal.h>
#include <sys/types.h>

#include <ATen/ops/arange.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/client_context.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "dray/v1/image_edit.grpc.pb.h"
#include "runtime/process/subprocess.h"
#include "runtime/rpc/grpc_util.h"
#include "workers/image/image_codec.h"

namespace dray {
namespace {

constexpr int kWorkers = 2;
constexpr int kBatchSize = 4;  // worker.image_edit.batch_size
constexpr int kMaxQueue = 16;  // --max-queue
constexpr absl::Duration kRequestTimeout = absl::Minutes(2);

// Service: `dray serve` running as a child, and the port it announced.
struct Service {
  std::unique_ptr<Subprocess> process;
  int port = 0;
};

// Announcement: what `dray serve` said before it served: its port, or its
// last words if it ended first.
struct Announcement {
  absl::Mutex mu;
  int port ABSL_GUARDED_BY(mu) = 0;
  bool ended ABSL_GUARDED_BY(mu) = false;
  std::string last_output ABSL_GUARDED_BY(mu);
};

absl::StatusOr<Service> StartService(const std::string& dray) {
  auto said = std::make_shared<Announcement>();
  SubprocessOptions spawn;
  spawn.argv = {dray,
                "serve",
                "--port=0",
                absl::StrCat("--workers=", kWorkers),
                absl::StrCat("--max-queue=", kMaxQueue),
                absl::StrCat("worker.image_edit.batch_size=", kBatchSize),
                "worker.image_edit.num_inference_steps=4"};
  spawn.on_output = [said](bool, std::string lines) {
    absl::MutexLock lock(&said->mu);
    said->last_output = lines;
    const size_t at = lines.find("ImageEditService on 127.0.0.1:");
    if (at != std::string::npos && said->port == 0) {
      std::sscanf(lines.c_str() + at, "ImageEditService on 127.0.0.1:%d", &said->port);
    }
  };
  Service service;
  DRAY_ASSIGN_OR_RETURN(service.process,
                        Subprocess::Spawn(std::move(spawn), [said](const ExitStatus&) {
                          absl::MutexLock lock(&said->mu);
                          said->ended = true;
                        }));
  absl::MutexLock lock(&said->mu);
  auto served = [said]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(said->mu) {
    return said->port > 0 || said->ended;
  };
  said->mu.AwaitWithTimeout(absl::Condition(&served), absl::Minutes(2));
  if (said->port <= 0) {
    service.process->Signal(SIGKILL);
    return absl::UnavailableError(absl::StrCat(
        "dray serve ", said->ended ? "ended" : "did not announce its port within 2 minutes",
        "; its last output: ", said->last_output));
  }
  service.port = said->port;
  return service;
}

// ChildrenOf lists the processes whose parent is `pid`.
std::vector<pid_t> ChildrenOf(pid_t pid) {
  std::vector<pid_t> children;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    int child = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &child)) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');  // the name may hold spaces
    int parent = 0;
    if (close != std::string::npos &&
        std::sscanf(line.c_str() + close + 1, " %*c %d", &parent) == 1 && parent == pid) {
      children.push_back(child);
    }
  }
  return children;
}

// Alive: whether `pid` runs (a zombie does not).
bool Alive(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

// PeakResidentMib: VmHWM of `pids`, summed, in MiB.
double PeakResidentMib(const std::vector<pid_t>& pids) {
  double kib = 0;
  for (pid_t pid : pids) {
    std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
    for (std::string line; std::getline(status, line);) {
      double value = 0;
      if (std::sscanf(line.c_str(), "VmHWM: %lf kB", &value) == 1) kib += value;
    }
  }
  return kib / 1024;
}

// Load: edit requests in flight on one service, and how they ended.
class Load {
 public:
  Load(v1::ImageEditService::Stub* stub, std::string image)
      : stub_(stub), image_(std::move(image)) {}

  // Send starts one request; with `refill_until` in the future, its end
  // starts another (a closed loop).
  void Send(absl::Time refill_until = absl::InfinitePast()) {
    auto* call = new Call;
    call->request.set_image(image_);
    call->request.set_instruction("make it purple");
    call->request.set_seed(1);
    SetDeadline(&call->context, kRequestTimeout);
    call->start = absl::Now();
    {
      absl::MutexLock lock(&mu_);
      ++in_flight_;
    }
    stub_->async()->Edit(&call->context, &call->request, &call->response,
                         [this, call, refill_until](grpc::Status status) {
                           const absl::Time now = absl::Now();
                           if (now < refill_until) Send(refill_until);  // before this one ends
                           Ended(status, now - call->start);
                           delete call;
                         });
  }

  // Wait returns once no request is in flight.
  void Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* in_flight) { return *in_flight == 0; }, &in_flight_));
  }

  int answered() const { return static_cast<int>(latencies_ms_.size()); }
  int exhausted() const { return exhausted_; }
  int failed() const { return failed_; }
  double Percentile(double fraction) const {
    return latencies_ms_.empty() ? 0 : dray::Percentile(latencies_ms_, fraction);
  }

 private:
  struct Call {
    grpc::ClientContext context;
    v1::EditImageRequest request;
    v1::EditImageResponse response;
    absl::Time start;
  };

  void Ended(const grpc::Status& status, absl::Duration took) {
    absl::MutexLock lock(&mu_);
    --in_flight_;
    if (status.ok()) {
      latencies_ms_.push_back(absl::ToDoubleMilliseconds(took));
    } else if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++exhausted_;
    } else {
      ++failed_;
      Log("bench", absl::StrCat("a request failed: ", status.error_message()));
    }
  }

  v1::ImageEditService::Stub* const stub_;
  const std::string image_;
  absl::Mutex mu_;
  int in_flight_ = 0;
  std::vector<double> latencies_ms_;
  int exhausted_ = 0;
  int failed_ = 0;
};

// OpenLoop sends requests at `per_second` for `duration`, whatever the
// answers, and waits for the last.
std::unique_ptr<Load> OpenLoop(v1::ImageEditService::Stub* stub, const std::string& image,
                               double per_second, absl::Duration duration) {
  auto load = std::make_unique<Load>(stub, image);
  const absl::Time start = absl::Now();
  for (int i = 0; i < per_second * absl::ToDoubleSeconds(duration); ++i) {
    const absl::Time at = start + absl::Seconds(i / per_second);
    if (at > absl::Now()) absl::SleepFor(at - absl::Now());
    load->Send();
  }
  load->Wait();
  return load;
}

}  // namespace

absl::StatusOr<std::vector<BenchMetric>> RunServeBench(const ServeBenchOptions& options) {
  std::vector<BenchMetric> metrics;
  auto emit = [&](std::string name, double value, std::string unit) {
    BenchMetric metric{std::move(name), value, std::move(unit)};
    if (options.report) options.report(metric);
    metrics.push_back(std::move(metric));
  };
  const absl::Duration phase = options.quick ? absl::Seconds(4) : absl::Seconds(15);
  DRAY_ASSIGN_OR_RETURN(
      std::string image,
      EncodePng(at::arange(64 * 64 * 3, at::kLong).remainder(256).to(at::kByte).view({64, 64, 3})));
  DRAY_ASSIGN_OR_RETURN(Service service, StartService(options.dray));
  const pid_t server = service.process->pid();
  auto stub =
      v1::ImageEditService::NewStub(CreateDrayChannel(absl::StrCat("127.0.0.1:", service.port)));
  std::vector<pid_t> processes = ChildrenOf(server);
  processes.push_back(server);

  // Capacity: as many requests in flight as the workers batch at once.
  Load capacity(stub.get(), image);
  const absl::Time start = absl::Now();
  for (int i = 0; i < kWorkers * kBatchSize; ++i) capacity.Send(start + phase);
  capacity.Wait();
  const double per_second = capacity.answered() / absl::ToDoubleSeconds(absl::Now() - start);
  emit("serve_capacity_per_s", per_second, "1/s");
  int failures = capacity.failed();

  for (const auto& [name, rate] : {std::pair{"2x", 2.0}, std::pair{"half", 0.5}}) {
    std::unique_ptr<Load> load = OpenLoop(stub.get(), image, rate * per_second, phase);
    emit(absl::StrCat("serve_", name, "_p50_ms"), load->Percentile(0.5), "ms");
    emit(absl::StrCat("serve_", name, "_p99_ms"), load->Percentile(0.99), "ms");
    emit(absl::StrCat("serve_", name, "_answered"), load->answered(), "requests");
    emit(absl::StrCat("serve_", name, "_exhausted"), load->exhausted(), "requests");
    failures += load->failed();
    if (rate > 1) emit("serve_peak_rss_start_mib", PeakResidentMib(processes), "MiB");
  }
  // The same overload again: a service that keeps nothing reaches the same peak.
  failures += OpenLoop(stub.get(), image, 2 * per_second, phase)->failed();
  emit("serve_peak_rss_end_mib", PeakResidentMib(processes), "MiB");

  service.process->Signal(SIGTERM);
  const std::optional<ExitStatus> ended = service.process->WaitFor(absl::Minutes(1));
  if (!ended.has_value() || ended->exit_code != 0) ++failures;
  if (!ended.has_value()) service.process->Signal(SIGKILL);
  processes.pop_back();
  emit("serve_failures", failures, "count");
  emit("serve_workers_left",
       std::count_if(processes.begin(), processes.end(), [](pid_t pid) { return Alive(pid); }),
       "count");
  return metrics;
}

}  // namespace dray
