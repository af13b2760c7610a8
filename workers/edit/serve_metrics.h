// ServeMetrics: dray serve's Prometheus metrics (prometheus-cpp), which its
// HTTP port shows at /metrics in Prometheus' text format:
//   dray_serve_requests_total{api, method, code}  counter: requests answered;
//       api "grpc" (method Edit, EditBatch or EditStream, code the gRPC
//       code's name) or "http" (method the route, code the HTTP status;
//       HTTP edits are also counted as the gRPC calls they make)
//   dray_serve_request_seconds{api, method}       histogram: their time (an
//       HTTP stream's, until its events begin)
//   dray_serve_queue_images                       gauge: images waiting for a batch
//   dray_serve_images_total{outcome}              counter: images answered, "edited"
//       or "failed" (rate(dray_serve_images_total{outcome="edited"}[1m]): images/s)
//   dray_serve_batch_rows                         histogram: rows per worker call
//   dray_serve_batch_seconds                      histogram: a worker call's time
//   dray_serve_ready                              gauge: 1 while the workers serve
//   dray_serve_worker_restarts_total              counter: worker group restarts
//   dray_worker_resident_bytes{rank}              gauge: each rank's host memory
//   dray_worker_device_allocated_bytes{rank}      gauge: and its GPU memory, as of
//                                                 its last answer
//
// Thread-safety: thread-safe.
#ifndef DRAY_WORKERS_EDIT_SERVE_METRICS_H_
#define DRAY_WORKERS_EDIT_SERVE_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "workers/edit/edit_backend.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace dray {

class ServeMetrics {
 public:
  // `backend` (its health, restarts and workers' memory, read at each
  // Render) must outlive this.
  explicit ServeMetrics(const EditBackend* backend);
  ~ServeMetrics();

  // Request records one answered request.
  void Request(const std::string& api, const std::string& method, const std::string& code,
               absl::Duration took);
  void QueueImages(int64_t images);
  // Batch records one worker call of `rows` rows.
  void Batch(int64_t rows, absl::Duration took, bool edited);

  // Render: every metric in Prometheus' text format.
  std::string Render();

 private:
  const EditBackend* const backend_;
  const std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& request_seconds_;
  prometheus::Gauge& queue_images_;
  prometheus::Family<prometheus::Counter>& images_;
  prometheus::Histogram& batch_rows_;
  prometheus::Histogram& batch_seconds_;
  prometheus::Gauge& ready_;
  prometheus::Counter& restarts_;
  prometheus::Family<prometheus::Gauge>& resident_bytes_;
  prometheus::Family<prometheus::Gauge>& device_bytes_;
  absl::Mutex render_mu_;  // one Render at a time brings the backend's figures in
};

}  // namespace dray

#endif  // DRAY_WORKERS_EDIT_SERVE_METRICS_H_
