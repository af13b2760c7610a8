#include "workers/train/trainer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "workers/image/image_codec.h"
#include "workers/models/qwen_image/embedded_model.h"
#include "workers/train/algorithms.h"
#include "workers/train/plot.h"
#include "workers/train/training_protocol.h"

namespace dray {
namespace {

namespace fs = std::filesystem;

std::string Duration(double seconds) {
  const int64_t s = std::llround(seconds);
  return s >= 60 ? absl::StrFormat("%dm%02ds", s / 60, s % 60) : absl::StrFormat("%ds", s);
}

double Seconds(absl::Time since) { return absl::ToDoubleSeconds(absl::Now() - since); }

// MetricsLine: one step's metrics as a metrics.jsonl line (the step an integer).
std::string MetricsLine(const std::map<std::string, double>& metrics) {
  nlohmann::json line(metrics);
  line["step"] = static_cast<int64_t>(metrics.at("step"));
  return line.dump();
}

// kEmbeddedScenes: the scenes of SFT's embedded task (each with every
// synthetic edit); DMD2's are the embedded model's own training scenes
// (seeds from kFirstTrainingScene), so that held-out scenes measure it.
constexpr int64_t kEmbeddedScenes = 8;
constexpr int64_t kFirstTrainingScene = 1000;

// How long a failed step waits to hear whether a worker died (the others'
// broken collectives may report first).
constexpr absl::Duration kFailureNoticeWait = absl::Seconds(2);

}  // namespace

FlowGrpoTrainer::FlowGrpoTrainer(TrainConfig config, Options options)
    : config_(std::move(config)), options_(std::move(options)), checkpoints_(config_) {}

FlowGrpoTrainer::~FlowGrpoTrainer() = default;

absl::StatusOr<std::unique_ptr<FlowGrpoTrainer>> FlowGrpoTrainer::Start(TrainConfig config,
                                                                        Options options) {
  DRAY_RETURN_IF_ERROR(config.Validate());
  const TrainingLaunch& launch = options.launch;
  const int world_size = launch.nodes * launch.workers;
  // DPO on its samples updates on one pair per prompt.
  const int64_t update_rows = config.dpo() ? config.prompts_per_step : config.rows_per_step();
  if (launch.workers < 1 || launch.nodes < 1 || config.rows_per_step() % world_size != 0 ||
      update_rows % world_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.prompts_per_step x algorithm.group_size = ", config.rows_per_step(),
                     " rows per step (dpo: data.prompts_per_step = ", config.prompts_per_step,
                     " pairs) must divide among the workers: --workers ", launch.workers,
                     launch.nodes > 1 ? absl::StrCat(" x --nodes ", launch.nodes) : ""));
  }
  std::unique_ptr<FlowGrpoTrainer> trainer(new FlowGrpoTrainer(config, std::move(options)));
  if (config.model.model_path.empty() || config.embedded_task()) {
    DRAY_ASSIGN_OR_RETURN(trainer->scratch_, ScratchDir::Create("dray-train"));
  }
  trainer->model_path_ = config.model.model_path;
  if (trainer->model_path_.empty()) {
    trainer->model_path_ = trainer->scratch_->path() + "/model";
    DRAY_RETURN_IF_ERROR(qwen_image::WriteEmbeddedModel(trainer->model_path_));
  }
  std::string data = config.train_files;
  if (config.embedded_task()) {
    const std::string task = trainer->scratch_->path() + "/task";
    fs::create_directories(task);
    const bool preferences = config.dpo() && config.paired();
    DRAY_ASSIGN_OR_RETURN(
        data, preferences       ? WriteEmbeddedPreferences(task)
              : config.paired() ? WriteSyntheticEditPairs(task, kEmbeddedScenes, 0)
              : config.dmd2() ? WriteSyntheticEditPairs(task, kEmbeddedScenes, kFirstTrainingScene)
                              : WriteEmbeddedTask(task));
  }
  const RowKind rows = !config.paired() ? RowKind::kPrompt
                       : config.dpo()   ? RowKind::kPreference
                                        : RowKind::kTarget;
  DRAY_ASSIGN_OR_RETURN(std::vector<TrainPrompt> prompts, ReadTrainPrompts(data, rows));
  trainer->sampler_.emplace(config, std::move(prompts));
  DRAY_ASSIGN_OR_RETURN(trainer->algorithm_, MakeTrainingAlgorithm(config));

  std::error_code error;
  fs::create_directories(fs::path(config.save_dir) / "samples", error);
  if (error) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create trainer.save_dir ", config.save_dir, ": ", error.message()));
  }

  DRAY_ASSIGN_OR_RETURN(std::optional<std::string> checkpoint, trainer->checkpoints_.ToResume());
  if (checkpoint.has_value())
    DRAY_RETURN_IF_ERROR(trainer->checkpoints_.SetAsideLaterThan(*checkpoint));
  DRAY_RETURN_IF_ERROR(WriteFile(config.save_dir + "/config.yaml", config.ToYaml()));
  DRAY_RETURN_IF_ERROR(trainer->StartWorkers());
  if (checkpoint.has_value()) {
    DRAY_RETURN_IF_ERROR(trainer->Restore(*checkpoint));
  } else {
    DRAY_RETURN_IF_ERROR(WriteFile(config.save_dir + "/metrics.jsonl", ""));
  }
  return trainer;
}

absl::Status FlowGrpoTrainer::StartWorkers() {
  if (options_.start_workers) {
    DRAY_ASSIGN_OR_RETURN(workers_, options_.start_workers(config_));
    return absl::OkStatus();
  }
  DRAY_ASSIGN_OR_RETURN(workers_, StartTrainingWorkers(config_, options_.launch));
  return absl::OkStatus();
}

absl::StatusOr<DataProto> FlowGrpoTrainer::PairedBatch(int64_t step) const {
  DRAY_ASSIGN_OR_RETURN(DataProto batch, sampler_->PairedRows(step));
  batch.SetMeta(kLearningRateKey, LearningRate(step));
  return batch;
}

double FlowGrpoTrainer::LearningRate(int64_t step) const {
  if (config_.lr_warmup_steps == 0) return config_.lr;
  return config_.lr * std::min(1.0, static_cast<double>(step + 1) /
                                        static_cast<double>(config_.lr_warmup_steps));
}

absl::StatusOr<DataProto> FlowGrpoTrainer::RolloutBatch(int64_t step) const {
  return sampler_->RolloutRows(step);
}

absl::StatusOr<Metrics> FlowGrpoTrainer::Step(int64_t step) {
  StepContext context{*sampler_, *workers_};
  context.lr = LearningRate(step);
  context.samples_due = step % config_.sample_every == 0 || step + 1 == config_.total_steps;
  context.write_samples = [this, step](const std::vector<SampleRow>& grid) {
    return WritePngFile(absl::StrCat(config_.save_dir, "/samples/step_", step, ".png"),
                        SampleGrid(grid, 96));
  };
  context.on_rollout_progress = options_.on_rollout_progress;
  DRAY_ASSIGN_OR_RETURN(Metrics metrics, algorithm_->Step(step, context));
  metrics["step"] = static_cast<double>(step);
  history_.push_back(metrics);
  DRAY_RETURN_IF_ERROR(WriteMetrics(step, metrics));
  return metrics;
}

absl::Status FlowGrpoTrainer::WriteMetrics(int64_t step,
                                           const std::map<std::string, double>& metrics) {
  {
    std::ofstream out(config_.save_dir + "/metrics.jsonl", std::ios::app);
    out << MetricsLine(metrics) << "\n";
    if (!out)
      return absl::DataLossError(
          absl::StrCat("cannot append to ", config_.save_dir, "/metrics.jsonl"));
  }
  if ((step + 1) % config_.log_every != 0 && step + 1 != config_.total_steps)
    return absl::OkStatus();
  // A series joins the steps that have its metric (samples' rewards every
  // sample_every steps, DMD2's generator loss every few).
  auto series = [&](const char* key, const char* name, Rgb color) {
    Series s{name, color, {}, {}};
    for (const auto& m : history_) {
      auto found = m.find(key);
      if (found == m.end()) continue;
      s.x.push_back(m.at("step"));
      s.y.push_back(found->second);
    }
    return s;
  };
  std::vector<at::Tensor> charts;
  for (const ChartSpec& chart : algorithm_->Charts()) {
    std::vector<Series> lines;
    for (const CurveSpec& curve : chart.curves)
      lines.push_back(series(curve.key.c_str(), curve.label.c_str(), curve.color));
    charts.push_back(LineChart(chart.title, lines, 720, 260));
  }
  return WritePngFile(config_.save_dir + "/curves.png", StackVertically(charts));
}

absl::Status FlowGrpoTrainer::SaveFinal() {
  const std::string final_dir = config_.save_dir + "/final";
  DRAY_RETURN_IF_ERROR(workers_->Save(final_dir));
  if (config_.lora_rank > 0 && !config_.vae()) return absl::OkStatus();
  // A trained component (the transformer, or the VAE): the others beside it.
  const std::string trained = config_.vae() ? "vae" : "transformer";
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(model_path_, error)) {
    const fs::path target = fs::path(final_dir) / entry.path().filename();
    if (entry.path().filename() == trained) {
      fs::copy_file(entry.path() / "config.json", target / "config.json",
                    fs::copy_options::overwrite_existing, error);
    } else {
      fs::copy(entry.path(), target,
               fs::copy_options::recursive | fs::copy_options::overwrite_existing, error);
    }
    if (error) break;
  }
  if (error) {
    return absl::DataLossError(absl::StrCat("cannot copy the model's other components from ",
                                            model_path_, " to ", final_dir, ": ", error.message()));
  }
  return absl::OkStatus();
}

absl::Status FlowGrpoTrainer::Restore(const std::string& checkpoint) {
  DRAY_ASSIGN_OR_RETURN(const nlohmann::json state, CheckpointManager::ReadState(checkpoint));
  if (static_cast<int64_t>(state["history"].size()) > config_.total_steps) {
    return absl::InvalidArgumentError(
        absl::StrCat(checkpoint, " is after step ", state["history"].size(),
                     ", beyond trainer.total_steps ", config_.total_steps));
  }
  DRAY_RETURN_IF_ERROR(workers_->LoadCheckpoint(checkpoint));
  history_.clear();
  for (const nlohmann::json& saved : state["history"]) {
    if (!saved.is_object() || !saved.contains("step") || !saved["step"].is_number() ||
        saved["step"].get<double>() != static_cast<double>(history_.size())) {
      const size_t entry = history_.size();
      history_.clear();
      return absl::DataLossError(absl::StrCat(checkpoint, "/", kTrainerStateFile,
                                              ": history entry ", entry, " is not step ", entry,
                                              "'s metrics"));
    }
    std::map<std::string, double>& metrics = history_.emplace_back();
    for (const auto& [key, value] : saved.items())  // JSON writes NaN as null
      metrics[key] = value.is_number() ? value.get<double>() : NAN;
  }
  std::string lines;
  for (const auto& metrics : history_) absl::StrAppend(&lines, MetricsLine(metrics), "\n");
  DRAY_RETURN_IF_ERROR(WriteFileAtomically(config_.save_dir + "/metrics.jsonl", lines));
  Log("train", absl::StrCat("resumed from ", checkpoint, " (after step ", history_.size(), ")"));
  return absl::OkStatus();
}

absl::Status FlowGrpoTrainer::SaveCheckpoint() {
  const nlohmann::json state = {
      {"step", history_.size()}, {"history", history_}, {"config", config_.ToYaml()}};
  return checkpoints_.Save(
      static_cast<int64_t>(history_.size()), state,
      [this](const std::string& dir) { return workers_->SaveCheckpoint(dir); });
}

absl::Status FlowGrpoTrainer::RestoreAfterRestart() {
  const std::string newest = checkpoints_.NewestComplete();
  if (!newest.empty()) return Restore(newest);
  history_.clear();  // no checkpoint yet: from the start, as the new workers are
  return WriteFileAtomically(config_.save_dir + "/metrics.jsonl", "");
}

absl::Status FlowGrpoTrainer::Run() {
  checkpoints_.RemovePartial();
  const absl::Time started = absl::Now();
  const int64_t first = static_cast<int64_t>(history_.size());
  while (static_cast<int64_t>(history_.size()) < config_.total_steps) {
    const int64_t step = static_cast<int64_t>(history_.size());
    absl::StatusOr<std::map<std::string, double>> metrics = Step(step);
    if (metrics.ok() && config_.save_every > 0 &&
        ((step + 1) % config_.save_every == 0 || step + 1 == config_.total_steps)) {
      absl::Status saved = SaveCheckpoint();
      if (!saved.ok()) metrics = saved;
    }
    if (!metrics.ok()) {
      const absl::Status health = workers_->HealthAfterFailure(kFailureNoticeWait);
      if (!health.ok() && workers_->Restart(health).ok()) {
        DRAY_RETURN_IF_ERROR(RestoreAfterRestart());
        continue;
      }
      return absl::Status(metrics.status().code(),
                          absl::StrCat("step ", step, ": ", metrics.status().message()));
    }
    ReportProgress(*metrics, first, started);
    if (stop_requested_ && step + 1 < config_.total_steps) return Stopped();
  }
  return SaveFinal();
}

absl::Status FlowGrpoTrainer::Stopped() {
  const int64_t steps = static_cast<int64_t>(history_.size());
  if (config_.save_every == 0) {
    return absl::CancelledError(
        absl::StrCat("stopped on request after step ", steps, " of ", config_.total_steps,
                     "; nothing was saved (trainer.save_every is 0), so a new run starts over"));
  }
  DRAY_RETURN_IF_ERROR(SaveCheckpoint());
  return absl::CancelledError(absl::StrCat("stopped on request after step ", steps, " of ",
                                           config_.total_steps, "; checkpoint ", NewestCheckpoint(),
                                           ": continue with trainer.resume=auto"));
}

std::string FlowGrpoTrainer::NewestCheckpoint() const { return checkpoints_.NewestComplete(); }

void FlowGrpoTrainer::ReportProgress(const std::map<std::string, double>& metrics, int64_t first,
                                     absl::Time started) const {
  const double elapsed = Seconds(started);
  const int64_t done = static_cast<int64_t>(history_.size());
  const double eta = elapsed / std::max<int64_t>(1, done - first) * (config_.total_steps - done);
  const std::string reward =
      metrics.count("reward_mean")
          ? absl::StrFormat("  reward %.4f (std %.4f)", metrics.at("reward_mean"),
                            metrics.at("reward_std"))
          : "";
  std::string loss = "- (not trained)";
  if (metrics.count("loss")) {
    loss = absl::StrFormat("%.3g", metrics.at("loss"));
  } else if (metrics.count("loss_fake_mean")) {  // DMD2's two models
    loss = absl::StrFormat("fake score %.3g", metrics.at("loss_fake_mean"));
    if (metrics.count("loss_dm")) absl::StrAppendFormat(&loss, ", dm %.3g", metrics.at("loss_dm"));
  }
  const std::string line = absl::StrFormat(
      "step %d/%d%s  loss %s  %.1f img/s  elapsed %s  ETA %s", done, config_.total_steps, reward,
      loss, metrics.at("images_per_s"), Duration(elapsed), Duration(eta));
  if (options_.progress_bar) {
    const int width = 20, filled = static_cast<int>(width * done / config_.total_steps);
    std::fprintf(stderr, "\r[%s%s] %s", std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), line.c_str());
    if (done == config_.total_steps) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  } else {
    Log("train", line);
  }
}

}  // namespace dray
