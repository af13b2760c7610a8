#include "cli/train_command.h"

#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "workers/train/train_config.h"
#include "workers/train/trainer.h"

namespace dray {

struct TrainCommand::Flags {
  std::string self;
  CLI::App* train = nullptr;
  std::string config_file;
  std::vector<std::string> overrides;
  int workers = 1;
};

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "dray train: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace

TrainCommand::TrainCommand(CLI::App& app, std::string self) : flags_(std::make_unique<Flags>()) {
  Flags& f = *flags_;
  f.self = std::move(self);
  f.train = app.add_subcommand(
      "train", "train Qwen-Image-Edit with Flow-GRPO (no config: the embedded task)");
  f.train->add_option("--config", f.config_file, "a YAML file in verl's layout");
  f.train->add_option("overrides", f.overrides,
                      "SECTION.KEY=VALUE overrides, e.g. worker.actor.lr=3e-4 "
                      "trainer.total_steps=50");
  f.train->add_option("--workers", f.workers, "worker processes (one per GPU)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

TrainCommand::~TrainCommand() = default;

std::optional<int> TrainCommand::Run() {
  const Flags& f = *flags_;
  if (!*f.train) return std::nullopt;
  absl::StatusOr<TrainConfig> config = TrainConfig::Load(f.config_file, f.overrides);
  if (!config.ok()) return Fail(config.status());
  std::printf("%s", config->ToYaml().c_str());
  std::fflush(stdout);
  std::fprintf(
      stderr, "dray train: %s, %lld steps of %lld prompts x %lld samples, %d worker%s\n",
      config->embedded_task() ? "the embedded task on the tiny model" : config->train_files.c_str(),
      static_cast<long long>(config->total_steps), static_cast<long long>(config->prompts_per_step),
      static_cast<long long>(config->group_size), f.workers, f.workers == 1 ? "" : "s");
  FlowGrpoTrainer::Options options;
  options.workers = f.workers;
  options.worker_command = {f.self, "worker"};
  options.progress_bar = isatty(fileno(stderr));
  absl::StatusOr<std::unique_ptr<FlowGrpoTrainer>> trainer =
      FlowGrpoTrainer::Start(*config, options);
  if (!trainer.ok()) return Fail(trainer.status());
  absl::Status ran = (*trainer)->Run();
  if (!ran.ok()) return Fail(ran);
  std::printf("wrote %s/{config.yaml,metrics.jsonl,curves.png,samples/,final/}\n",
              config->save_dir.c_str());
  return 0;
}

}  // namespace dray
