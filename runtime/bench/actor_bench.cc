#include "runtime/bench/actor_bench.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ATen/ops/zeros.h>

#include <algorithm>
#include <memory>
#include <random>
#include <thread>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "dispatch/status_macros.h"
#include "dray/v1/bench.grpc.pb.h"
#include "runtime/grpc_util.h"
#include "runtime/subprocess.h"
#include "runtime/worker_group.h"

namespace dray {
namespace {

constexpr absl::Duration kCallTimeout = absl::Seconds(60);

class BenchWorker : public Worker {
 public:
  BenchWorker() {
    Def("echo", &BenchWorker::Echo, {kOneToAll});
    Def("echo_async", &BenchWorker::Echo, {kOneToAll, ExecuteMode::kAll, /*blocking=*/false});
    Def("echo_batch", &BenchWorker::Echo, {kDpComputeProto});
  }
  absl::StatusOr<DataProto> Echo(const DataProto& input) { return input; }
};

class EchoServiceImpl final : public v1::EchoService::Service {
  grpc::Status Echo(grpc::ServerContext*, const v1::EchoMessage* request,
                    v1::EchoMessage* response) override {
    *response = *request;
    return grpc::Status::OK;
  }
};

// Repetitions: how many times each measurement runs.
struct Repetitions {
  int latency;      // round trips per latency figure
  int async_calls;  // calls in the pipelined run
  int batches;      // DP_COMPUTE_PROTO batches
};

double Percentile(std::vector<double> samples, double fraction) {
  std::sort(samples.begin(), samples.end());
  return samples[std::min(samples.size() - 1, static_cast<size_t>(fraction * samples.size()))];
}

// TimeRoundTrips runs `call` `count` times (after a warm-up) and returns the
// durations in microseconds.
absl::StatusOr<std::vector<double>> TimeRoundTrips(int count, const std::function<absl::Status()>& call) {
  for (int i = 0; i < std::max(10, count / 10); ++i) DRAY_RETURN_IF_ERROR(call());
  std::vector<double> micros;
  micros.reserve(count);
  for (int i = 0; i < count; ++i) {
    const absl::Time start = absl::Now();
    DRAY_RETURN_IF_ERROR(call());
    micros.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  return micros;
}

class Bench {
 public:
  Bench(const ActorBenchOptions& options)
      : options_(options),
        reps_(options.quick ? Repetitions{300, 2000, 3} : Repetitions{3000, 20000, 10}) {}

  absl::StatusOr<std::vector<BenchMetric>> Run();

 private:
  void Report(std::string name, double value, std::string unit) {
    BenchMetric metric{std::move(name), value, std::move(unit)};
    if (options_.report) options_.report(metric);
    metrics_.push_back(std::move(metric));
  }
  absl::StatusOr<std::unique_ptr<WorkerGroup>> Group(int workers) {
    WorkerGroupOptions group;
    group.command = options_.worker_command;
    group.roles = {"bench"};
    group.call_timeout = kCallTimeout;
    return WorkerGroup::Create({1, workers}, group);
  }
  absl::Status GrpcEcho();
  absl::Status SingleWorker(const DataProto& tiny);
  absl::Status OneToAll(WorkerGroup* group, const DataProto& tiny);
  absl::Status DpComputeProto(WorkerGroup* group);
  absl::Status LoopbackTcp();

  const ActorBenchOptions& options_;
  const Repetitions reps_;
  std::vector<BenchMetric> metrics_;
  double grpc_echo_p50_ = 0;
};

absl::Status Bench::GrpcEcho() {
  DRAY_ASSIGN_OR_RETURN(int port, PickFreePort());
  SubprocessOptions server;
  server.argv = options_.echo_server_command;
  server.argv.push_back(absl::StrCat("--port=", port));
  server.output_prefix = "[echo server] ";
  DRAY_ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> process, Subprocess::Spawn(server));
  auto stub = v1::EchoService::NewStub(CreateDrayChannel(absl::StrCat("127.0.0.1:", port)));
  v1::EchoMessage request;
  request.set_data(std::string(16, 'x'));
  bool first = true;
  DRAY_ASSIGN_OR_RETURN(std::vector<double> micros, TimeRoundTrips(reps_.latency, [&] {
    grpc::ClientContext context;
    SetDeadline(&context, first ? absl::Seconds(30) : absl::Seconds(5));
    context.set_wait_for_ready(first);  // the server may still be starting
    first = false;
    v1::EchoMessage response;
    return ToAbslStatus(stub->Echo(&context, request, &response), "echo");
  }));
  grpc_echo_p50_ = Percentile(micros, 0.5);
  Report("grpc_echo_p50_us", grpc_echo_p50_, "us");
  return absl::OkStatus();
}

absl::Status Bench::SingleWorker(const DataProto& tiny) {
  DRAY_ASSIGN_OR_RETURN(std::unique_ptr<WorkerGroup> group, Group(1));
  DRAY_ASSIGN_OR_RETURN(std::vector<double> micros, TimeRoundTrips(reps_.latency, [&] {
    return group->Call("echo", {tiny}).status();
  }));
  const double p50 = Percentile(micros, 0.5);
  Report("call_sync_p50_us", p50, "us");
  Report("call_sync_p99_us", Percentile(micros, 0.99), "us");
  Report("call_sync_p50_vs_grpc_echo", p50 / grpc_echo_p50_, "x");

  std::vector<GroupFuture> futures;
  futures.reserve(reps_.async_calls);
  const absl::Time start = absl::Now();
  for (int i = 0; i < reps_.async_calls; ++i) futures.push_back(group->Invoke("echo_async", {tiny}));
  for (GroupFuture& future : futures) DRAY_RETURN_IF_ERROR(future.Get().status());
  Report("calls_async_per_s", reps_.async_calls / absl::ToDoubleSeconds(absl::Now() - start), "1/s");
  return OneToAll(group.get(), tiny);
}

absl::Status Bench::OneToAll(WorkerGroup* group, const DataProto& tiny) {
  DRAY_ASSIGN_OR_RETURN(std::vector<double> micros, TimeRoundTrips(reps_.latency, [&] {
    return group->Call("echo", {tiny}).status();
  }));
  Report(absl::StrCat("one_to_all_p50_us_w", group->world_size()), Percentile(micros, 0.5), "us");
  return absl::OkStatus();
}

absl::Status Bench::DpComputeProto(WorkerGroup* group) {
  constexpr int kImages = 64, kSide = 512, kChannels = 3;
  std::mt19937 rng(0);
  std::vector<Image> images;
  for (int i = 0; i < kImages; ++i) {
    std::string pixels(kSide * kSide * kChannels, '\0');
    for (char& c : pixels) c = static_cast<char>(rng());
    images.push_back({Image::Format::kRaw, kSide, kSide, kChannels, std::move(pixels)});
  }
  DRAY_ASSIGN_OR_RETURN(DataProto batch, DataProto::Make({}, {{"images", std::move(images)}}));
  DRAY_RETURN_IF_ERROR(group->Call("echo_batch", {batch}).status());  // warm-up
  const absl::Time start = absl::Now();
  for (int i = 0; i < reps_.batches; ++i) DRAY_RETURN_IF_ERROR(group->Call("echo_batch", {batch}).status());
  const double bytes = 2.0 * kImages * kSide * kSide * kChannels * reps_.batches;
  const double gbps = bytes / absl::ToDoubleSeconds(absl::Now() - start) / 1e9;
  Report("dp_compute_proto_gbps", gbps, "GB/s");
  for (const BenchMetric& metric : metrics_) {
    if (metric.name == "loopback_tcp_gbps") {
      Report("dp_compute_proto_vs_loopback", gbps / metric.value, "x");
    }
  }
  return absl::OkStatus();
}

// LoopbackTcp streams bytes through a 127.0.0.1 TCP connection between two threads.
absl::Status Bench::LoopbackTcp() {
  const size_t total = (options_.quick ? size_t{256} : size_t{1024}) << 20;
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    if (listener >= 0) close(listener);
    return absl::UnavailableError("loopback benchmark: cannot listen on 127.0.0.1");
  }
  std::thread sender([&] {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
      const std::string chunk(1 << 20, 'x');
      for (size_t sent = 0; sent < total;) {
        const ssize_t n = write(fd, chunk.data(), std::min(chunk.size(), total - sent));
        if (n <= 0) break;
        sent += n;
      }
    }
    close(fd);
  });
  const int receiver = accept(listener, nullptr, nullptr);
  std::string buffer(1 << 20, '\0');
  size_t received = 0;
  const absl::Time start = absl::Now();
  while (received < total) {
    const ssize_t n = read(receiver, buffer.data(), buffer.size());
    if (n <= 0) break;
    received += n;
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  sender.join();
  close(receiver);
  close(listener);
  if (received != total) return absl::UnavailableError("loopback benchmark: connection cut short");
  Report("loopback_tcp_gbps", received / seconds / 1e9, "GB/s");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<BenchMetric>> Bench::Run() {
  if (options_.workers < 1) return absl::InvalidArgumentError("--workers must be at least 1");
  DRAY_ASSIGN_OR_RETURN(DataProto tiny, DataProto::Make({{"x", at::zeros({1}, at::kLong)}}));
  DRAY_RETURN_IF_ERROR(GrpcEcho());
  DRAY_RETURN_IF_ERROR(SingleWorker(tiny));
  DRAY_RETURN_IF_ERROR(LoopbackTcp());
  bool dp_measured = false;
  for (int workers : {2, 4, 8}) {
    DRAY_ASSIGN_OR_RETURN(std::unique_ptr<WorkerGroup> group, Group(workers));
    DRAY_RETURN_IF_ERROR(OneToAll(group.get(), tiny));
    if (workers == options_.workers) {
      DRAY_RETURN_IF_ERROR(DpComputeProto(group.get()));
      dp_measured = true;
    }
  }
  if (!dp_measured) {
    DRAY_ASSIGN_OR_RETURN(std::unique_ptr<WorkerGroup> group, Group(options_.workers));
    DRAY_RETURN_IF_ERROR(DpComputeProto(group.get()));
  }
  return metrics_;
}

}  // namespace

absl::StatusOr<std::vector<BenchMetric>> RunActorBench(const ActorBenchOptions& options) {
  return Bench(options).Run();
}

void RegisterBenchWorkers(WorkerClassRegistry* classes) { classes->Add<BenchWorker>("bench"); }

absl::Status RunEchoServer(int port) {
  EchoServiceImpl service;
  grpc::ServerBuilder builder;
  ConfigureDrayServer(&builder);
  int bound = 0;
  builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(), &bound);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound == 0) {
    return absl::UnavailableError(absl::StrCat("echo server cannot listen on 127.0.0.1:", port));
  }
  server->Wait();
  return absl::OkStatus();
}

}  // namespace dray
