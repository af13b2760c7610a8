// The service under load, run by `dray bench --suite serve`: `dray serve` on
// the embedded model runs as a child process, and this one drives it, first
// with as many requests in flight as it batches at once (its capacity),
// then with requests arriving at fixed intervals at twice the capacity, at
// half of it, and at twice again:
//   serve_capacity_per_s               answered requests per second, closed loop
//   serve_2x_p50_ms, serve_2x_p99_ms   latency of the answered requests at 2x
//   serve_2x_answered, serve_2x_exhausted
//                                      answered, and refused RESOURCE_EXHAUSTED
//   serve_half_p50_ms, ..._p99_ms, ..._answered, ..._exhausted
//                                      the same at half the capacity
//   serve_peak_rss_start_mib, serve_peak_rss_end_mib
//                                      the service's peak resident memory (its
//                                      own and its workers') after the first
//                                      overload and after the second: the same
//                                      load should not raise it
//   serve_failures                     requests that failed otherwise, plus one
//                                      if the service did not exit 0 on SIGTERM
//   serve_workers_left                 worker processes alive once it exited
#ifndef DRAY_WORKERS_BENCH_SERVE_BENCH_H_
#define DRAY_WORKERS_BENCH_SERVE_BENCH_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/bench/bench_metric.h"

namespace dray {

struct ServeBenchOptions {
  std::string dray;  // the dray binary, run as `dray serve`
  bool quick = false;
  BenchReporter report;
};

absl::StatusOr<std::vector<BenchMetric>> RunServeBench(const ServeBenchOptions& options);

}  // namespace dray

#endif  // DRAY_WORKERS_BENCH_SERVE_BENCH_H_
