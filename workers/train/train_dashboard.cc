#include "workers/train/train_dashboard.h"

#include <httplib.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "workers/train/checkpoint_manager.h"
#include "workers/train/train_page.h"

namespace dray {
namespace {

namespace fs = std::filesystem;

std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Steps: metrics.jsonl's lines, each an object (a line still being written
// is left out).
nlohmann::json Steps(const fs::path& metrics) {
  nlohmann::json steps = nlohmann::json::array();
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json step = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (step.is_object()) steps.push_back(std::move(step));
  }
  return steps;
}

// SampleStep: N of "step_N.png", or -1.
int64_t SampleStep(const std::string& name) {
  static const std::regex pattern(R"(step_(\d{1,12})\.png)");
  std::smatch match;
  return std::regex_match(name, match, pattern) ? std::stoll(match[1]) : -1;
}

// Samples: the sample grids' names, in step order.
std::vector<std::string> Samples(const fs::path& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ignored;
  for (const auto& entry : fs::directory_iterator(dir, ignored)) {
    const std::string name = entry.path().filename();
    if (const int64_t step = SampleStep(name); step >= 0) found.push_back({step, name});
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> names;
  for (auto& [step, name] : found) names.push_back(std::move(name));
  return names;
}

// MetricName: metrics.jsonl key `key` as a Prometheus name.
std::string MetricName(std::string key) {
  if (key == "images_per_s") key = "images_per_second";
  if (absl::EndsWith(key, "_s")) key += "econds";
  for (char& c : key) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return absl::StrCat("dray_train_", key);
}

}  // namespace

TrainDashboard::TrainDashboard(const TrainConfig& config, DashboardOptions options)
    : config_(config), options_(std::move(options)) {}

TrainDashboard::~TrainDashboard() {
  if (server_ != nullptr) server_->Shutdown();
}

absl::StatusOr<std::unique_ptr<TrainDashboard>> TrainDashboard::Start(const TrainConfig& config,
                                                                      DashboardOptions options) {
  std::unique_ptr<TrainDashboard> dashboard(new TrainDashboard(config, std::move(options)));
  DRAY_ASSIGN_OR_RETURN(dashboard->server_, HttpServer::Create(dashboard->options_.http));
  HttpServer& http = *dashboard->server_;
  const TrainDashboard* self = dashboard.get();
  http.HandleGet("/", HttpServer::kOpen, [](const auto&, auto& response, const auto&) {
    response.set_content(kTrainPage, "text/html; charset=utf-8");
    return absl::OkStatus();
  });
  http.HandleGet("/api/run", HttpServer::kOpen,
                 [self](const auto&, auto& response, const auto&) -> absl::Status {
                   DRAY_ASSIGN_OR_RETURN(nlohmann::json run, self->Run());
                   ReplyJson(response, 200, run);
                   return absl::OkStatus();
                 });
  http.HandleGet(
      R"(/samples/(step_\d+\.png))", HttpServer::kOpen,
      [self](const httplib::Request& request, auto& response, const auto&) {
        const fs::path file =
            fs::path(self->config_.save_dir) / "samples" / std::string(request.matches[1]);
        if (!fs::is_regular_file(file)) {
          return absl::NotFoundError(absl::StrCat("no sample ", file.filename().string()));
        }
        response.set_content(ReadText(file), "image/png");
        return absl::OkStatus();
      });
  http.HandleGet("/metrics", HttpServer::kOpen, [self](const auto&, auto& response, const auto&) {
    response.set_content(self->Render(), "text/plain; version=0.0.4; charset=utf-8");
    return absl::OkStatus();
  });
  http.HandleGet("/health", HttpServer::kOpen, [](const auto&, auto& response, const auto&) {
    ReplyJson(response, 200, {{"status", "ok"}});
    return absl::OkStatus();
  });
  http.Start();
  return dashboard;
}

absl::StatusOr<nlohmann::json> TrainDashboard::Run() const {
  const fs::path dir = config_.save_dir;
  nlohmann::json checkpoints = nlohmann::json::array();
  for (const std::string& checkpoint : CheckpointManager(config_).Complete()) {
    checkpoints.push_back(fs::path(checkpoint).filename().string());
  }
  return nlohmann::json{{"config", ReadText(dir / "config.yaml")},
                        {"total_steps", config_.total_steps},
                        {"restarts", options_.restarts ? options_.restarts() : 0},
                        {"steps", Steps(dir / "metrics.jsonl")},
                        {"samples", Samples(dir / "samples")},
                        {"checkpoints", std::move(checkpoints)}};
}

std::string TrainDashboard::Render() const {
  prometheus::Registry registry;  // the values of now: a new registry each time
  auto gauge = [&](const std::string& name, const std::string& help, double value) {
    prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({}).Set(value);
  };
  const nlohmann::json steps = Steps(fs::path(config_.save_dir) / "metrics.jsonl");
  gauge("dray_train_total_steps", "Steps the run is to take", config_.total_steps);
  if (!steps.empty()) {
    for (const auto& [key, value] : steps.back().items()) {
      if (!value.is_number()) continue;
      gauge(MetricName(key), absl::StrCat("metrics.jsonl's ", key, " at the newest step"),
            value.get<double>());
    }
  }
  prometheus::BuildCounter()
      .Name("dray_train_restarts_total")
      .Help("Restarts of the worker group")
      .Register(registry)
      .Add({})
      .Increment(options_.restarts ? options_.restarts() : 0);
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

}  // namespace dray
