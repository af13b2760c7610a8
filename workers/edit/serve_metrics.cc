#include "workers/edit/serve_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <vector>

namespace dray {
namespace {

// Seconds from a hundredth of a second to ten minutes, each bound 2-2.5x the last.
const prometheus::Histogram::BucketBoundaries kSeconds = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                                          2.5,  5,     10,   25,  60,   150, 600};
const prometheus::Histogram::BucketBoundaries kRows = {1, 2, 4, 8, 16, 32, 64, 128};

}  // namespace

ServeMetrics::ServeMetrics(const EditBackend* backend)
    : backend_(backend),
      registry_(std::make_shared<prometheus::Registry>()),
      requests_(prometheus::BuildCounter()
                    .Name("dray_serve_requests_total")
                    .Help("Requests answered, by API, method and code")
                    .Register(*registry_)),
      request_seconds_(prometheus::BuildHistogram()
                           .Name("dray_serve_request_seconds")
                           .Help("Time to answer a request, by API and method")
                           .Register(*registry_)),
      queue_images_(prometheus::BuildGauge()
                        .Name("dray_serve_queue_images")
                        .Help("Images waiting for a batch")
                        .Register(*registry_)
                        .Add({})),
      images_(prometheus::BuildCounter()
                  .Name("dray_serve_images_total")
                  .Help("Images answered by the workers, edited or failed")
                  .Register(*registry_)),
      batch_rows_(prometheus::BuildHistogram()
                      .Name("dray_serve_batch_rows")
                      .Help("Rows per worker call")
                      .Register(*registry_)
                      .Add({}, kRows)),
      batch_seconds_(prometheus::BuildHistogram()
                         .Name("dray_serve_batch_seconds")
                         .Help("Time of a worker call")
                         .Register(*registry_)
                         .Add({}, kSeconds)),
      ready_(prometheus::BuildGauge()
                 .Name("dray_serve_ready")
                 .Help("1 while the workers serve, else 0")
                 .Register(*registry_)
                 .Add({})),
      restarts_(prometheus::BuildCounter()
                    .Name("dray_serve_worker_restarts_total")
                    .Help("Restarts of the worker group")
                    .Register(*registry_)
                    .Add({})),
      resident_bytes_(prometheus::BuildGauge()
                          .Name("dray_worker_resident_bytes")
                          .Help("A worker's host memory (RSS) as of its last answer")
                          .Register(*registry_)),
      device_bytes_(prometheus::BuildGauge()
                        .Name("dray_worker_device_allocated_bytes")
                        .Help("A worker's GPU memory (LibTorch's allocator) as of its last answer")
                        .Register(*registry_)) {}

ServeMetrics::~ServeMetrics() = default;

void ServeMetrics::Request(const std::string& api, const std::string& method,
                           const std::string& code, absl::Duration took) {
  requests_.Add({{"api", api}, {"method", method}, {"code", code}}).Increment();
  request_seconds_.Add({{"api", api}, {"method", method}}, kSeconds)
      .Observe(absl::ToDoubleSeconds(took));
}

void ServeMetrics::QueueImages(int64_t images) { queue_images_.Set(static_cast<double>(images)); }

void ServeMetrics::Batch(int64_t rows, absl::Duration took, bool edited) {
  batch_rows_.Observe(static_cast<double>(rows));
  batch_seconds_.Observe(absl::ToDoubleSeconds(took));
  images_.Add({{"outcome", edited ? "edited" : "failed"}}).Increment(static_cast<double>(rows));
}

std::string ServeMetrics::Render() {
  {
    absl::MutexLock lock(&render_mu_);
    ready_.Set(backend_->Health().ok() ? 1 : 0);
    restarts_.Increment(backend_->restarts() - restarts_.Value());
    const std::vector<RankMemory> ranks = backend_->WorkerMemory();
    for (size_t rank = 0; rank < ranks.size(); ++rank) {
      if (!ranks[rank].known) continue;
      const prometheus::Labels labels = {{"rank", std::to_string(rank)}};
      resident_bytes_.Add(labels).Set(static_cast<double>(ranks[rank].resident_bytes));
      device_bytes_.Add(labels).Set(static_cast<double>(ranks[rank].device_allocated_bytes));
    }
  }
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace dray
