#include "cli/train_command.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
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
      "train",
      "train Qwen-Image-Edit with Flow-GRPO or SFT (algorithm.name=sft), checkpointed with "
      "trainer.save_every and resumed with trainer.resume=auto (no config: the embedded task)");
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
  const std::string batch = config->sft() ? absl::StrCat(config->prompts_per_step, " pairs")
                                          : absl::StrCat(config->prompts_per_step, " prompts x ",
                                                         config->group_size, " samples");
  std::fprintf(stderr, "dray train: %s %s, %lld step%s of %s, %d worker%s\n",
               config->sft() ? "SFT on" : "Flow-GRPO on",
               config->embedded_task() ? "the embedded task" : config->train_files.c_str(),
               static_cast<long long>(config->total_steps), config->total_steps == 1 ? "" : "s",
               batch.c_str(), f.workers, f.workers == 1 ? "" : "s");
  FlowGrpoTrainer::Options options;
  options.workers = f.workers;
  options.worker_command = {f.self, "worker"};
  options.progress_bar = isatty(fileno(stderr));
  absl::StatusOr<std::unique_ptr<FlowGrpoTrainer>> trainer =
      FlowGrpoTrainer::Start(*config, options);
  if (!trainer.ok()) return Fail(trainer.status());
  absl::Status ran = (*trainer)->Run();
  if (!ran.ok()) return Fail(ran);
  std::error_code ignored;
  std::printf("wrote %s/{config.yaml,metrics.jsonl,curves.png,samples/,final/}\n",
              std::filesystem::absolute(config->save_dir, ignored).c_str());
  return 0;
}

}  // namespace dray
