// BenchMetric: one figure of `dray bench`, printed as a table row or as one
// JSON object per line ({"name": ..., "value": ..., "unit": ...}), and the
// percentiles the benchmarks report.
#ifndef DRAY_RUNTIME_BENCH_BENCH_METRIC_H_
#define DRAY_RUNTIME_BENCH_BENCH_METRIC_H_

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace dray {

struct BenchMetric {
  std::string name;
  double value = 0;
  std::string unit;
};

// BenchReporter receives each figure as soon as it is measured (progress).
using BenchReporter = std::function<void(const BenchMetric&)>;

// Percentile: the sample at `fraction` (0.5: the median) of non-empty `samples`.
inline double Percentile(std::vector<double> samples, double fraction) {
  std::sort(samples.begin(), samples.end());
  return samples[std::min(samples.size() - 1, static_cast<size_t>(fraction * samples.size()))];
}

inline double Median(std::vector<double> samples) { return Percentile(std::move(samples), 0.5); }

}  // namespace dray

#endif  // DRAY_RUNTIME_BENCH_BENCH_METRIC_H_
