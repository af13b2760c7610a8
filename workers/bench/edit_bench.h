// The image-edit benchmark, run by `dray bench --suite edit`: the tiny model
// (the embedded default) through real worker processes, all in one run:
//   edit_images_per_s_w1, _w2   images per second through ImageEditController
//                               (batches of 8 at 128^2, 4 steps) at 1 and 2 workers
//   edit_speedup_w2             the second over the first
//   edit_direct_p50_ms          one image (64^2, 1 step) through ImageEditController
//   edit_served_p50_ms          the same image through ImageEditService (gRPC),
//                               calls of the two kinds interleaved
//   serve_overhead_ms           the median difference of neighbouring pairs: the
//                               service's added latency, its batching wait
//                               (max_wait, 20 ms) included
#ifndef DRAY_WORKERS_BENCH_EDIT_BENCH_H_
#define DRAY_WORKERS_BENCH_EDIT_BENCH_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/bench/bench_metric.h"

namespace dray {

struct EditBenchOptions {
  std::vector<std::string> worker_command;  // `dray worker`
  bool quick = false;
  BenchReporter report;
};

absl::StatusOr<std::vector<BenchMetric>> RunEditBench(const EditBenchOptions& options);

}  // namespace dray

#endif  // DRAY_WORKERS_BENCH_EDIT_BENCH_H_
