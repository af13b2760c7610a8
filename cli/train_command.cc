#include "cli/train_command.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "base/stop_signals.h"
#include "cli/cluster_commands.h"
#include "workers/train/train_config.h"
#include "workers/train/train_dashboard.h"
#include "workers/train/trainer.h"

namespace dray {

struct TrainCommand::Flags {
  std::string self;
  CLI::App* train = nullptr;
  std::string config_file;
  std::vector<std::string> overrides;
  int workers = 1;
  std::optional<int> http_port;  // the dashboard's; unset: none
  std::string http_host = "127.0.0.1";
  ClusterFlags cluster;
};

namespace {

int Fail(const absl::Status& status) {
  Log("train", status.ToString());
  return 1;
}

// StopOnSignals waits until `done`. A first SIGINT or SIGTERM while the
// workers start exits at once; once `trainer` is running, it asks it to
// stop after its step (saving a checkpoint), and a second exits at once (the
// workers die with this process).
void StopOnSignals(const std::atomic<FlowGrpoTrainer*>& trainer, const absl::Notification& done) {
  bool asked = false;
  while (!done.HasBeenNotified()) {
    const int signal = WaitForStopSignal(/*timeout_ms=*/200);
    if (signal == 0) continue;
    FlowGrpoTrainer* running = trainer.load();
    if (running != nullptr && !asked) {
      Log("train", absl::StrCat(strsignal(signal), ": stopping after this step (",
                                strsignal(signal), " again stops at once)"));
      running->RequestStop();
      asked = true;
      continue;
    }
    const std::string checkpoint = running == nullptr ? "" : running->NewestCheckpoint();
    Log("train", absl::StrCat(strsignal(signal), ", exiting now; ",
                              checkpoint.empty()
                                  ? "no checkpoint was saved"
                                  : absl::StrCat("the newest checkpoint is ", checkpoint,
                                                 " (trainer.resume=auto continues from it)")));
    std::_Exit(128 + signal);
  }
}

// StartDashboard serves --http-port with the cluster's certificate, if any.
absl::StatusOr<std::unique_ptr<TrainDashboard>> StartDashboard(
    const TrainCommand::Flags& f, const TrainConfig& config,
    const std::atomic<FlowGrpoTrainer*>& running) {
  DashboardOptions options;
  options.http.address = absl::StrCat(f.http_host, ":", *f.http_port);
  const TlsFlags& tls = f.cluster.tls;
  if (!tls.cert.empty()) options.http.tls = {tls.cert, tls.key, tls.ca, tls.mutual};
  options.restarts = [&running] {
    const FlowGrpoTrainer* trainer = running.load();
    return trainer == nullptr ? 0 : trainer->restarts();
  };
  DRAY_ASSIGN_OR_RETURN(std::unique_ptr<TrainDashboard> dashboard,
                        TrainDashboard::Start(config, std::move(options)));
  Log("train", absl::StrCat("dashboard on ", tls.cert.empty() ? "http" : "https", "://",
                            f.http_host, ":", dashboard->port(), "/ (metrics at /metrics)"));
  return dashboard;
}

}  // namespace

TrainCommand::TrainCommand(CLI::App& app, std::string self) : flags_(std::make_unique<Flags>()) {
  Flags& f = *flags_;
  f.self = std::move(self);
  f.train = app.add_subcommand(
      "train",
      "train Qwen-Image-Edit or FLUX.1 Kontext (by worker.image_edit.model_path) with Flow-GRPO "
      "or, by algorithm.name, flow_grpo_fast, grpo_guard, mix_grpo, dance_grpo, diffusion_nft, "
      "dpo, sft, dmd2 or Qwen's VAE (vae), checkpointed with "
      "trainer.save_every and resumed with trainer.resume=auto, rolled out a step ahead with "
      "trainer.async=true (no config: the embedded task)");
  f.train->add_option("--config", f.config_file, "a YAML file in verl's layout");
  f.train->add_option("overrides", f.overrides,
                      "SECTION.KEY=VALUE overrides, e.g. worker.actor.lr=3e-4 "
                      "trainer.total_steps=50");
  f.train->add_option("--workers", f.workers, "worker processes (one per GPU) on each node")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  f.train
      ->add_option("--http-port", f.http_port,
                   "serve a dashboard here (curves, samples, checkpoints, configuration; "
                   "Prometheus metrics at /metrics); 0 picks a free port")
      ->check(CLI::Range(0, 65535));
  f.train
      ->add_option("--http-host", f.http_host, "the dashboard's address (0.0.0.0: every interface)")
      ->capture_default_str();
  f.cluster.Add(f.train);
}

TrainCommand::~TrainCommand() = default;

std::optional<int> TrainCommand::Run() {
  const Flags& f = *flags_;
  if (!*f.train) return std::nullopt;
  absl::StatusOr<TrainConfig> config = TrainConfig::Load(f.config_file, f.overrides);
  if (!config.ok()) return Fail(config.status());
  const ClusterFlags cluster = f.cluster.WithConfig(config->cluster);
  std::printf("%s", config->ToYaml().c_str());
  std::fflush(stdout);
  const std::string batch = config->paired() ? absl::StrCat(config->prompts_per_step, " pairs")
                            : config->dmd2() ? absl::StrCat(config->prompts_per_step, " prompts")
                                             : absl::StrCat(config->prompts_per_step, " prompts x ",
                                                            config->group_size, " samples");
  const std::string rollout_group =
      config->async_rollout ? absl::StrCat(" and ", config->rollout_workers,
                                           " rollout worker(s) a step ahead (trainer.async)")
                            : "";
  Log("train",
      absl::StrCat(FindAlgorithm(config->name)->title, " on ",
                   config->embedded_task() ? "the embedded task" : config->train_files, ", ",
                   config->total_steps, config->total_steps == 1 ? " step" : " steps", " of ",
                   batch, ", ", WorkerLayout(cluster, f.workers), rollout_group));
  absl::StatusOr<std::unique_ptr<NodePool>> pool = cluster.StartPool();  // outlives the trainer
  if (!pool.ok()) return Fail(pool.status());
  BlockStopSignals();  // for StopOnSignals; threads started from here on inherit the mask
  std::atomic<FlowGrpoTrainer*> running{nullptr};
  absl::StatusOr<std::unique_ptr<TrainDashboard>> dashboard;
  if (f.http_port.has_value()) {
    dashboard = StartDashboard(f, *config, running);
    if (!dashboard.ok()) return Fail(dashboard.status());
  }
  absl::Notification done;
  std::thread stopper([&] { StopOnSignals(running, done); });
  FlowGrpoTrainer::Options options;
  options.launch.workers = f.workers;
  options.launch.nodes = cluster.nodes;
  options.launch.node_pool = pool->get();
  options.launch.worker_command = {f.self, "worker"};
  options.progress_bar = isatty(fileno(stderr));
  absl::StatusOr<std::unique_ptr<FlowGrpoTrainer>> trainer =
      FlowGrpoTrainer::Start(*config, options);
  absl::Status ran = trainer.status();
  if (trainer.ok()) {
    running = trainer->get();
    ran = (*trainer)->Run();
  }
  done.Notify();
  stopper.join();                          // before the trainer goes
  if (dashboard.ok()) dashboard->reset();  // and its last request, which may ask the trainer
  if (!ran.ok()) return Fail(ran);
  std::error_code ignored;
  std::printf("wrote %s/{config.yaml,metrics.jsonl,curves.png,samples/,final/}\n",
              std::filesystem::absolute(config->save_dir, ignored).c_str());
  return 0;
}

}  // namespace dray
