#include "runtime/bench/actor_bench.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "dray/v1/bench.grpc.pb.h"
#include "runtime/controller/worker_group.h"
#include "runtime/process/subprocess.h"
#include "runtime/rpc/grpc_util.h"

namespace dray {
namespace {

constexpr absl::Duration kCallTimeout = absl::Seconds(60);

class BenchWorker : public Worker {
 public:
  BenchWorker() {
    Def("echo", &BenchWorker::Echo, {kOneToAll});
    Def("echo_async", &BenchWorker::Echo, {kOneToAll, ExecuteMode::kAll, /*blocking=*/false});
    Def("echo_batch", &BenchWorker::Echo, {kDpComputeProto});
    Def("fresh_batch", &BenchWorker::Fresh, {kDpComputeProto});
    Def("receive", &BenchWorker::Receive, {kOneToAll});
    Def("start_time", &BenchWorker::StartTime, {kOneToAll});
  }
  absl::StatusOr<DataProto> Echo(const DataProto& input) { return input; }
  absl::StatusOr<DataProto> Receive(const DataProto&) { return DataProto(); }
  // Fresh answers a batch of images with as many images of this worker's
  // own (made once): a result of new bytes, unlike Echo's, which carries
  // its input's.
  absl::StatusOr<DataProto> Fresh(const DataProto& input) {
    DRAY_ASSIGN_OR_RETURN(const std::vector<Image>* images, input.GetRows<Image>("images"));
    if (!fresh_.has_value() || fresh_->size() != static_cast<int64_t>(images->size())) {
      std::vector<Image> own;
      for (const Image& image : *images) {
        own.push_back(image);
        own.back().bytes = std::string(image.bytes.view());
      }
      DRAY_ASSIGN_OR_RETURN(fresh_, DataProto::Make({}, {{"images", std::move(own)}}));
    }
    return *fresh_;
  }

 private:
  std::optional<DataProto> fresh_;
  // StartTime says when the call began here (this machine's clock).
  absl::StatusOr<DataProto> StartTime() {
    return DataProto::Make({}, {}, {{"start_unix_ns", absl::ToUnixNanos(absl::Now())}});
  }
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
  int batches;      // DP_COMPUTE_PROTO batches, each paired with a loopback transfer
};

absl::StatusOr<double> Microseconds(const std::function<absl::Status()>& call) {
  const absl::Time start = absl::Now();
  DRAY_RETURN_IF_ERROR(call());
  return absl::ToDoubleMicroseconds(absl::Now() - start);
}

// TimeRoundTrips appends the durations of `count` runs of `call` to `micros`.
absl::Status TimeRoundTrips(int count, const std::function<absl::Status()>& call,
                            std::vector<double>* micros) {
  for (int i = 0; i < count; ++i) {
    DRAY_ASSIGN_OR_RETURN(double us, Microseconds(call));
    micros->push_back(us);
  }
  return absl::OkStatus();
}

int WarmUpRounds(int count) { return std::max(10, count / 10); }

// PairedSamples: durations in microseconds of two operations timed alternately.
struct PairedSamples {
  std::vector<double> first, second;
};

// TimePaired runs `first` and `second` `count` times each (after a warm-up),
// alternating in blocks of kPairBlock round trips: each block runs in steady
// state, and both operations see the same load on a shared machine.
absl::StatusOr<PairedSamples> TimePaired(int count, const std::function<absl::Status()>& first,
                                         const std::function<absl::Status()>& second) {
  constexpr int kPairBlock = 25;
  std::vector<double> discarded;
  DRAY_RETURN_IF_ERROR(TimeRoundTrips(WarmUpRounds(count), first, &discarded));
  DRAY_RETURN_IF_ERROR(TimeRoundTrips(WarmUpRounds(count), second, &discarded));
  PairedSamples samples;
  for (int done = 0; done < count; done += kPairBlock) {
    const int n = std::min(kPairBlock, count - done);
    DRAY_RETURN_IF_ERROR(TimeRoundTrips(n, first, &samples.first));
    DRAY_RETURN_IF_ERROR(TimeRoundTrips(n, second, &samples.second));
  }
  return samples;
}

// LoopbackTransfer streams `bytes` through a 127.0.0.1 TCP connection
// between two threads, in 1 MiB writes.
absl::Status LoopbackTransfer(size_t bytes) {
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
      for (size_t sent = 0; sent < bytes;) {
        const ssize_t n = write(fd, chunk.data(), std::min(chunk.size(), bytes - sent));
        if (n <= 0) break;
        sent += n;
      }
    }
    close(fd);
  });
  const int receiver = accept(listener, nullptr, nullptr);
  std::string buffer(1 << 20, '\0');
  size_t received = 0;
  while (received < bytes) {
    const ssize_t n = read(receiver, buffer.data(), buffer.size());
    if (n <= 0) break;
    received += n;
  }
  sender.join();
  close(receiver);
  close(listener);
  if (received != bytes) return absl::UnavailableError("loopback benchmark: connection cut short");
  return absl::OkStatus();
}

// RandomImages makes `count` RGB images of `side` x `side` random pixels.
absl::StatusOr<DataProto> RandomImages(int count, int side) {
  std::mt19937 rng(0);
  std::vector<Image> images;
  for (int i = 0; i < count; ++i) {
    std::string pixels(size_t{3} * side * side, '\0');
    for (char& c : pixels) c = static_cast<char>(rng());
    images.push_back({Image::Format::kRaw, side, side, 3, std::move(pixels)});
  }
  return DataProto::Make({}, {{"images", std::move(images)}});
}

class Bench {
 public:
  Bench(const ActorBenchOptions& options)
      : options_(options),
        reps_(options.quick ? Repetitions{300, 2000, 6} : Repetitions{3000, 20000, 12}) {}

  absl::StatusOr<std::vector<BenchMetric>> Run();

 private:
  void Report(std::string name, double value, std::string unit) {
    BenchMetric metric{std::move(name), value, std::move(unit)};
    if (options_.report) options_.report(metric);
    metrics_.push_back(std::move(metric));
  }
  // Group starts `workers` bench workers on this node, called through their
  // unix sockets, or over TCP as on other nodes.
  absl::StatusOr<std::unique_ptr<WorkerGroup>> Group(
      int workers, WorkerGroupOptions::Transport transport = WorkerGroupOptions::Transport::kAuto) {
    WorkerGroupOptions group;
    group.transport = transport;
    group.command = options_.worker_command;
    group.roles = {"bench"};
    group.call_timeout = kCallTimeout;
    return WorkerGroup::Create({1, workers}, group);
  }
  absl::Status SingleWorker(const DataProto& tiny);
  absl::Status CallSyncAgainstEcho(WorkerGroup* group, const DataProto& tiny);
  absl::Status CallSyncOverTcp(const DataProto& tiny);
  absl::Status OneToAll(WorkerGroup* group, const DataProto& tiny);
  absl::StatusOr<double> Broadcast64MiB(WorkerGroup* group);
  absl::Status DispatchSkew(WorkerGroup* group);
  absl::Status DpComputeProtoAgainstLoopback(WorkerGroup* group, WorkerGroup* tcp_group);

  const ActorBenchOptions& options_;
  const Repetitions reps_;
  std::vector<BenchMetric> metrics_;
};

// CallSyncAgainstEcho times blocking actor calls and raw gRPC echoes of a
// server process alternately.
absl::Status Bench::CallSyncAgainstEcho(WorkerGroup* group, const DataProto& tiny) {
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
  auto echo = [&] {
    grpc::ClientContext context;
    SetDeadline(&context, first ? absl::Seconds(30) : absl::Seconds(5));
    context.set_wait_for_ready(first);  // the server may still be starting
    first = false;
    v1::EchoMessage response;
    return ToAbslStatus(stub->Echo(&context, request, &response), "echo");
  };
  auto call = [&] { return group->Call("echo", {tiny}).status(); };
  DRAY_ASSIGN_OR_RETURN(PairedSamples micros, TimePaired(reps_.latency, echo, call));
  const double echo_p50 = Percentile(micros.first, 0.5), call_p50 = Percentile(micros.second, 0.5);
  Report("grpc_echo_p50_us", echo_p50, "us");
  Report("call_sync_p50_us", call_p50, "us");
  Report("call_sync_p99_us", Percentile(micros.second, 0.99), "us");
  Report("call_sync_p50_vs_grpc_echo", call_p50 / echo_p50, "x");
  return absl::OkStatus();
}

// CallSyncOverTcp times blocking actor calls over TCP, as to another node.
absl::Status Bench::CallSyncOverTcp(const DataProto& tiny) {
  DRAY_ASSIGN_OR_RETURN(std::unique_ptr<WorkerGroup> group,
                        Group(1, WorkerGroupOptions::Transport::kTcp));
  auto call = [&] { return group->Call("echo", {tiny}).status(); };
  std::vector<double> micros;
  DRAY_RETURN_IF_ERROR(TimeRoundTrips(WarmUpRounds(reps_.latency), call, &micros));
  micros.clear();
  DRAY_RETURN_IF_ERROR(TimeRoundTrips(reps_.latency, call, &micros));
  Report("call_sync_tcp_p50_us", Percentile(micros, 0.5), "us");
  return absl::OkStatus();
}

absl::Status Bench::SingleWorker(const DataProto& tiny) {
  DRAY_ASSIGN_OR_RETURN(std::unique_ptr<WorkerGroup> group, Group(1));
  DRAY_RETURN_IF_ERROR(CallSyncAgainstEcho(group.get(), tiny));
  DRAY_RETURN_IF_ERROR(CallSyncOverTcp(tiny));
  std::vector<GroupFuture> futures;
  futures.reserve(reps_.async_calls);
  const absl::Time start = absl::Now();
  for (int i = 0; i < reps_.async_calls; ++i)
    futures.push_back(group->Invoke("echo_async", {tiny}));
  for (GroupFuture& future : futures) DRAY_RETURN_IF_ERROR(future.Get().status());
  Report("calls_async_per_s", reps_.async_calls / absl::ToDoubleSeconds(absl::Now() - start),
         "1/s");
  return OneToAll(group.get(), tiny);
}

absl::Status Bench::OneToAll(WorkerGroup* group, const DataProto& tiny) {
  auto call = [&] { return group->Call("echo", {tiny}).status(); };
  std::vector<double> micros;
  DRAY_RETURN_IF_ERROR(TimeRoundTrips(WarmUpRounds(reps_.latency), call, &micros));
  micros.clear();
  DRAY_RETURN_IF_ERROR(TimeRoundTrips(reps_.latency, call, &micros));
  Report(absl::StrCat("one_to_all_p50_us_w", group->world_size()), Percentile(micros, 0.5), "us");
  return absl::OkStatus();
}

// Broadcast64MiB times ONE_TO_ALL calls whose argument is 64 MiB (the
// workers answer nothing), reports the median in ms and returns it.
absl::StatusOr<double> Bench::Broadcast64MiB(WorkerGroup* group) {
  DRAY_ASSIGN_OR_RETURN(DataProto big,
                        DataProto::Make({{"big", at::zeros({16 << 20}, at::kFloat)}}));
  auto call = [&] { return group->Call("receive", {big}).status(); };
  std::vector<double> micros;
  DRAY_RETURN_IF_ERROR(TimeRoundTrips(1, call, &micros));  // warm-up
  micros.clear();
  DRAY_RETURN_IF_ERROR(TimeRoundTrips(reps_.batches, call, &micros));
  const double ms = Percentile(micros, 0.5) / 1e3;
  Report(absl::StrCat("one_to_all_64mib_ms_w", group->world_size()), ms, "ms");
  return ms;
}

// DispatchSkew reports the median spread of a ONE_TO_ALL call's start
// times across the group's ranks: how far the last rank starts after the
// first.
absl::Status Bench::DispatchSkew(WorkerGroup* group) {
  std::vector<double> spreads_ms;
  for (int i = 0; i < reps_.batches; ++i) {
    DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> starts, group->Call("start_time", {}));
    int64_t first = std::numeric_limits<int64_t>::max(), last = 0;
    for (const DataProto& start : starts) {
      DRAY_ASSIGN_OR_RETURN(int64_t ns, start.GetMeta<int64_t>("start_unix_ns"));
      first = std::min(first, ns);
      last = std::max(last, ns);
    }
    spreads_ms.push_back((last - first) / 1e6);
  }
  Report(absl::StrCat("dispatch_skew_ms_w", group->world_size()), Percentile(spreads_ms, 0.5),
         "ms");
  return absl::OkStatus();
}

// DpComputeProtoAgainstLoopback alternates DP_COMPUTE_PROTO echoes of 64 RGB
// 512x512 images, in shared memory and over TCP, and calls answered with as
// many new images, with loopback TCP transfers and memcpy of as many bytes.
absl::Status Bench::DpComputeProtoAgainstLoopback(WorkerGroup* group, WorkerGroup* tcp_group) {
  constexpr int kImages = 64, kSide = 512;
  DRAY_ASSIGN_OR_RETURN(DataProto batch, RandomImages(kImages, kSide));
  const size_t bytes = size_t{2} * kImages * kSide * kSide * 3;  // sent plus returned
  auto loopback = [&] { return LoopbackTransfer(bytes); };
  auto dp_call = [&] { return group->Call("echo_batch", {batch}).status(); };
  auto fresh_call = [&] { return group->Call("fresh_batch", {batch}).status(); };
  auto tcp_call = [&] { return tcp_group->Call("echo_batch", {batch}).status(); };
  std::string from(bytes, 'x'), to(bytes, '\0');
  auto copy = [&] {
    std::memcpy(to.data(), from.data(), bytes);
    return absl::OkStatus();
  };
  double loopback_us = 0, dp_us = 0, fresh_us = 0, tcp_us = 0, memcpy_us = 0;
  for (int i = -1; i < reps_.batches; ++i) {  // -1: warm-up
    DRAY_ASSIGN_OR_RETURN(double loopback_round, Microseconds(loopback));
    DRAY_ASSIGN_OR_RETURN(double dp_round, Microseconds(dp_call));
    DRAY_ASSIGN_OR_RETURN(double fresh_round, Microseconds(fresh_call));
    DRAY_ASSIGN_OR_RETURN(double tcp_round, Microseconds(tcp_call));
    DRAY_ASSIGN_OR_RETURN(double memcpy_round, Microseconds(copy));
    if (i < 0) continue;
    loopback_us += loopback_round;
    dp_us += dp_round;
    fresh_us += fresh_round;
    tcp_us += tcp_round;
    memcpy_us += memcpy_round;
  }
  auto gbps = [&](double us) { return bytes * reps_.batches / us / 1e3; };
  Report("memcpy_gbps", gbps(memcpy_us), "GB/s");
  Report("loopback_tcp_gbps", gbps(loopback_us), "GB/s");
  Report("dp_compute_proto_gbps", gbps(dp_us), "GB/s");
  Report("dp_compute_proto_vs_loopback", loopback_us / dp_us, "x");
  Report("dp_compute_proto_vs_memcpy", memcpy_us / dp_us, "x");
  Report("dp_compute_proto_fresh_gbps", gbps(fresh_us), "GB/s");
  Report("dp_compute_proto_fresh_vs_loopback", loopback_us / fresh_us, "x");
  Report("dp_compute_proto_tcp_gbps", gbps(tcp_us), "GB/s");
  Report("dp_compute_proto_tcp_vs_loopback", loopback_us / tcp_us, "x");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<BenchMetric>> Bench::Run() {
  if (options_.workers < 1) return absl::InvalidArgumentError("--workers must be at least 1");
  DRAY_ASSIGN_OR_RETURN(DataProto tiny, DataProto::Make({{"x", at::zeros({1}, at::kLong)}}));
  DRAY_RETURN_IF_ERROR(SingleWorker(tiny));
  double broadcast_w1_ms = 0;
  {
    DRAY_ASSIGN_OR_RETURN(std::unique_ptr<WorkerGroup> group, Group(1));
    DRAY_ASSIGN_OR_RETURN(broadcast_w1_ms, Broadcast64MiB(group.get()));
  }
  for (int workers : {2, 4, 8}) {
    DRAY_ASSIGN_OR_RETURN(std::unique_ptr<WorkerGroup> group, Group(workers));
    DRAY_RETURN_IF_ERROR(OneToAll(group.get(), tiny));
    if (workers == 8) {
      DRAY_ASSIGN_OR_RETURN(double broadcast_w8_ms, Broadcast64MiB(group.get()));
      Report("one_to_all_64mib_w8_vs_w1", broadcast_w8_ms / broadcast_w1_ms, "x");
    }
  }
  {  // Wide fan-out: 64 workers of a light role.
    DRAY_ASSIGN_OR_RETURN(std::unique_ptr<WorkerGroup> group, Group(64));
    DRAY_RETURN_IF_ERROR(OneToAll(group.get(), tiny));
    DRAY_RETURN_IF_ERROR(DispatchSkew(group.get()));
  }
  DRAY_ASSIGN_OR_RETURN(std::unique_ptr<WorkerGroup> group, Group(options_.workers));
  DRAY_ASSIGN_OR_RETURN(std::unique_ptr<WorkerGroup> tcp_group,
                        Group(options_.workers, WorkerGroupOptions::Transport::kTcp));
  DRAY_RETURN_IF_ERROR(DpComputeProtoAgainstLoopback(group.get(), tcp_group.get()));
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
  builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                           &bound);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound == 0) {
    return absl::UnavailableError(absl::StrCat("echo server cannot listen on 127.0.0.1:", port));
  }
  server->Wait();
  return absl::OkStatus();
}

}  // namespace dray
