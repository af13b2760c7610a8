// The actor runtime's benchmark, run by `dray bench --suite runtime`.
//
// Every figure is measured in the same run as the baseline it is judged
// against, the two timed alternately so that both see the same load on a
// shared machine: actor calls against a raw gRPC echo between two processes,
// and DP_COMPUTE_PROTO bandwidth against raw loopback TCP and memcpy. Figures
// (docs/benchmarks.md says what each means and what it aims at):
//   grpc_echo_p50_us                 raw gRPC unary echo round trip (baseline)
//   call_sync_p50_us, _p99_us        blocking actor call, tiny argument, 1 worker
//   call_sync_p50_vs_grpc_echo       ratio of the two p50s
//   call_sync_tcp_p50_us             the same over TCP, as to another node
//   calls_async_per_s                pipelined asynchronous calls to 1 worker
//   one_to_all_p50_us_w{1,2,4,8,64}  ONE_TO_ALL round trip at 1 to 64 workers
//   one_to_all_64mib_ms_w{1,8}       ONE_TO_ALL of a 64 MiB argument, and
//   one_to_all_64mib_w8_vs_w1        their ratio
//   dispatch_skew_ms_w64             spread of 64 ranks' start times
//   memcpy_gbps, loopback_tcp_gbps   the baselines: one core's memcpy, TCP
//                                    over 127.0.0.1
//   dp_compute_proto_gbps            DP_COMPUTE_PROTO echo of 64 RGB 512x512
//                                    images over N workers, bytes both ways / wall
//   dp_compute_proto_vs_loopback,    its ratios to the baselines
//     _vs_memcpy
//   dp_compute_proto_fresh_gbps,     the same, the workers answering images of
//     _fresh_vs_loopback             their own (new bytes, where the echo's
//                                    result hands its input's rows back)
//   dp_compute_proto_tcp_gbps,       the echo over TCP, as across nodes
//     _tcp_vs_loopback
#ifndef DRAY_RUNTIME_BENCH_ACTOR_BENCH_H_
#define DRAY_RUNTIME_BENCH_ACTOR_BENCH_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/bench/bench_metric.h"
#include "runtime/worker/worker.h"

namespace dray {

struct ActorBenchOptions {
  // Runs a worker process hosting the classes of RegisterBenchWorkers
  // (--controller= and --roles= are appended).
  std::vector<std::string> worker_command;
  // Runs RunEchoServer (--port= is appended).
  std::vector<std::string> echo_server_command;
  int workers = 4;     // ranks for dp_compute_proto_gbps
  bool quick = false;  // fewer repetitions
  BenchReporter report;
};

// RunActorBench measures every figure above.
absl::StatusOr<std::vector<BenchMetric>> RunActorBench(const ActorBenchOptions& options);

// RegisterBenchWorkers adds the worker class the benchmark calls ("bench").
void RegisterBenchWorkers(WorkerClassRegistry* classes);

// RunEchoServer serves dray.v1.EchoService on 127.0.0.1:`port` until the
// process is killed.
absl::Status RunEchoServer(int port);

}  // namespace dray

#endif  // DRAY_RUNTIME_BENCH_ACTOR_BENCH_H_
