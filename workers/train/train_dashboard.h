// TrainDashboard: dray train's HTTP port (--http-port): a page with the
// run's curves redrawn as its steps finish, the newest samples, the
// configuration and the checkpoints, and the run's metrics for Prometheus.
// It reads what the trainer writes to trainer.save_dir (config.yaml,
// metrics.jsonl, samples/step_N.png, checkpoints/step_N/) at each request,
// so it shows the run as it stands on disk, a resumed one's earlier steps
// included.
//   GET /                   the page (kTrainPage), which asks /api/run every 2 s
//   GET /api/run            {"config": its YAML, "total_steps", "restarts",
//                           "steps": [each metrics.jsonl line], "samples":
//                           ["step_10.png", ...], "checkpoints": ["step_000020", ...]}
//   GET /samples/step_N.png a sample grid
//   GET /metrics            Prometheus' text format: dray_train_step and,
//                           from the newest step, dray_train_<key> for each
//                           of its metrics (reward_mean, loss, ...; "_s"
//                           spelled "_seconds", "/" as "_"), and
//                           dray_train_restarts_total
//   GET /health             200 while the process answers
// Errors, bounds, TLS and request ids are HttpServer's.
//
// Thread-safety: thread-safe.
#ifndef DRAY_WORKERS_TRAIN_TRAIN_DASHBOARD_H_
#define DRAY_WORKERS_TRAIN_TRAIN_DASHBOARD_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/http/http_server.h"
#include "workers/train/train_config.h"

namespace dray {

struct DashboardOptions {
  HttpServer::Options http;
  std::function<int()> restarts;  // the trainer's worker restarts so far; unset: 0
};

class TrainDashboard {
 public:
  // Start serves `config`'s run until Shutdown (or destruction).
  static absl::StatusOr<std::unique_ptr<TrainDashboard>> Start(const TrainConfig& config,
                                                               DashboardOptions options);
  ~TrainDashboard();

  int port() const { return server_->port(); }
  void Shutdown() { server_->Shutdown(); }

  // Render: the run's metrics in Prometheus' text format.
  std::string Render() const;

 private:
  TrainDashboard(const TrainConfig& config, DashboardOptions options);
  absl::StatusOr<nlohmann::json> Run() const;

  const TrainConfig config_;
  const DashboardOptions options_;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_TRAIN_DASHBOARD_H_
