// BenchMetric: one figure of `dray bench`, printed as a table row or as one
// JSON object per line ({"name": ..., "value": ..., "unit": ...}).
#ifndef DRAY_RUNTIME_BENCH_BENCH_METRIC_H_
#define DRAY_RUNTIME_BENCH_BENCH_METRIC_H_

#include <functional>
#include <string>

namespace dray {

struct BenchMetric {
  std::string name;
  double value = 0;
  std::string unit;
};

// BenchReporter receives each figure as soon as it is measured (progress).
using BenchReporter = std::function<void(const BenchMetric&)>;

}  // namespace dray

#endif  // DRAY_RUNTIME_BENCH_BENCH_METRIC_H_
