#include "workers/train/trainer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "workers/edit/edit_batch.h"
#include "workers/image/image_codec.h"
#include "workers/models/qwen_image/embedded_model.h"
#include "workers/train/flow_grpo_worker.h"
#include "workers/train/plot.h"
#include "workers/train/remote_reward.h"
#include "workers/train/reward_worker.h"
#include "workers/train/rewards.h"

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
// synthetic edit).
constexpr int64_t kEmbeddedScenes = 8;

}  // namespace

namespace {

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
  const int world_size = options.nodes * options.workers;
  if (options.workers < 1 || options.nodes < 1 || config.rows_per_step() % world_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.prompts_per_step x algorithm.group_size = ", config.rows_per_step(),
                     " rows per step must divide among the workers: --workers ", options.workers,
                     options.nodes > 1 ? absl::StrCat(" x --nodes ", options.nodes) : ""));
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
    DRAY_ASSIGN_OR_RETURN(data, config.paired() ? WriteSyntheticEditPairs(task, kEmbeddedScenes, 0)
                                                : WriteEmbeddedTask(task));
  }
  DRAY_ASSIGN_OR_RETURN(std::vector<TrainPrompt> prompts, ReadTrainPrompts(data, config.paired()));
  trainer->sampler_.emplace(config, std::move(prompts));
  DRAY_ASSIGN_OR_RETURN(trainer->advantages_, rl::FindAdvantageEstimator(config.adv_estimator));
  if (!config.remote_rewards.empty() && !config.paired()) {
    DRAY_ASSIGN_OR_RETURN(trainer->remote_scorers_, RemoteScorers::Connect(config.remote_rewards));
    DRAY_RETURN_IF_ERROR(trainer->remote_scorers_->Score({}).get().status());  // each one answers
  }

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
  workers_.reset();  // the failed ones first: their processes are reaped
  if (options_.start_workers) {
    DRAY_ASSIGN_OR_RETURN(workers_, options_.start_workers(config_));
    return absl::OkStatus();
  }
  TrainingLaunch launch;
  launch.workers = options_.workers;
  launch.nodes = options_.nodes;
  launch.node_pool = options_.node_pool;
  launch.worker_command = options_.worker_command;
  launch.env = options_.env;
  launch.init_timeout = options_.init_timeout;
  launch.call_timeout = options_.call_timeout;
  DRAY_ASSIGN_OR_RETURN(workers_, StartTrainingWorkers(config_, launch));
  return absl::OkStatus();
}

absl::StatusOr<DataProto> FlowGrpoTrainer::PairedBatch(int64_t step) const {
  DRAY_ASSIGN_OR_RETURN(DataProto batch, sampler_->PairedRows(step));
  batch.SetMeta("lr", LearningRate(step));
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

absl::StatusOr<std::vector<double>> FlowGrpoTrainer::Rewards(
    int64_t step, const DataProto& rollout, const DataProto& rows,
    std::map<std::string, double>& metrics) const {
  DRAY_ASSIGN_OR_RETURN(const std::vector<Image>* outputs, rollout.GetRows<Image>(kEditedColumn));
  DRAY_ASSIGN_OR_RETURN(const std::vector<std::string>* instructions,
                        rows.GetRows<std::string>(kInstructionsColumn));
  const std::vector<const TrainPrompt*> prompts = sampler_->PromptsOf(step);
  std::vector<RewardInput> samples;
  for (size_t i = 0; i < outputs->size(); ++i) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor pixels, DecodeImageRow((*outputs)[i]));
    const TrainPrompt& prompt = *prompts[i / config_.group_size];
    samples.push_back({std::move(pixels), prompt.pixels, (*instructions)[i], prompt.fields});
  }
  // The remote scorers work while the built-in functions run here.
  std::future<absl::StatusOr<std::vector<RemoteScores>>> remote;
  if (remote_scorers_ != nullptr) remote = remote_scorers_->Score(samples);
  const double n = static_cast<double>(samples.size());
  std::vector<double> total(samples.size(), 0.0);
  DRAY_ASSIGN_OR_RETURN(at::Tensor scores, FunctionScores(step, samples, rollout, rows));
  for (size_t f = 0; f < config_.reward_functions.size(); ++f) {
    const at::Tensor column = scores.select(1, static_cast<int64_t>(f));
    for (size_t i = 0; i < samples.size(); ++i)
      total[i] += config_.reward_weights[f] * column[i].item<double>();
    metrics["reward/" + config_.reward_functions[f]] = column.mean().item<double>();
  }
  if (!remote.valid()) return total;
  DRAY_ASSIGN_OR_RETURN(std::vector<RemoteScores> scored, remote.get());
  for (size_t r = 0; r < scored.size(); ++r) {
    const RemoteRewardConfig& scorer = config_.remote_rewards[r];
    double sum = 0;
    for (size_t i = 0; i < samples.size(); ++i) {
      total[i] += scorer.weight * scored[r].scores[i];
      sum += scored[r].scores[i];
    }
    metrics["reward/" + scorer.name] = sum / n;
    for (const auto& [part, values] : scored[r].components) {
      double part_sum = 0, scored_rows = 0;  // over the rows the part was given for
      for (double value : values) {
        if (!std::isfinite(value)) continue;
        part_sum += value;
        scored_rows += 1;
      }
      metrics[absl::StrCat("reward/", scorer.name, "/", part)] = part_sum / scored_rows;
    }
  }
  return total;
}

absl::StatusOr<at::Tensor> FlowGrpoTrainer::FunctionScores(int64_t step,
                                                           const std::vector<RewardInput>& samples,
                                                           const DataProto& rollout,
                                                           const DataProto& rows) const {
  const std::vector<std::string>& names = config_.reward_functions;
  if (config_.reward_placement != "controller") {
    DRAY_ASSIGN_OR_RETURN(DataProto batch,
                          rows.Select({{},
                                       std::vector<std::string>{kImagesColumn, kInstructionsColumn},
                                       std::vector<std::string>{}}));
    DRAY_ASSIGN_OR_RETURN(DataProto edited, rollout.Select({std::vector<std::string>{},
                                                            std::vector<std::string>{kEditedColumn},
                                                            std::vector<std::string>{}}));
    DRAY_ASSIGN_OR_RETURN(batch, batch.Union(edited));
    std::vector<Json> fields;
    for (const RewardInput& sample : samples) fields.push_back({sample.fields.dump()});
    DRAY_RETURN_IF_ERROR(batch.AddNonTensor(kRewardFieldsColumn, std::move(fields)));
    batch.SetMeta("functions", Json{nlohmann::json(names).dump()});
    return workers_->ComputeReward(batch);
  }
  at::Tensor scores = at::empty(
      {static_cast<int64_t>(samples.size()), static_cast<int64_t>(names.size())}, at::kDouble);
  const std::vector<const TrainPrompt*> prompts = sampler_->PromptsOf(step);
  for (size_t f = 0; f < names.size(); ++f) {
    DRAY_ASSIGN_OR_RETURN(RewardFunction reward, FindRewardFunction(names[f]));
    for (size_t i = 0; i < samples.size(); ++i) {
      absl::StatusOr<double> value = reward(samples[i]);
      if (!value.ok()) {
        return absl::Status(value.status().code(),
                            absl::StrCat("reward ", names[f], ", sample ", i, " (",
                                         prompts[i / config_.group_size]->image_path,
                                         "): ", value.status().message()));
      }
      scores[i][f] = *value;
    }
  }
  return scores;
}

absl::StatusOr<std::map<std::string, double>> FlowGrpoTrainer::Step(int64_t step) {
  return config_.paired() ? PairedStep(step) : GrpoStep(step);
}

absl::StatusOr<std::map<std::string, double>> FlowGrpoTrainer::PairedStep(int64_t step) {
  const bool vae = config_.vae();
  std::map<std::string, double> metrics = {{"step", static_cast<double>(step)}};
  const absl::Time started = absl::Now();
  DRAY_ASSIGN_OR_RETURN(DataProto batch, PairedBatch(step));
  DRAY_ASSIGN_OR_RETURN(std::vector<DataProto> updated, workers_->PairedUpdate(batch, vae));
  const std::vector<const char*> keys =
      vae ? std::vector<const char*>{"loss", "reconstruction_rmse", "kl", "latent_std", "grad_norm"}
          : std::vector<const char*>{"loss", "grad_norm"};
  for (const DataProto& rank : updated) {
    for (const char* key : keys) {
      DRAY_ASSIGN_OR_RETURN(double value, rank.GetMeta<double>(key));
      metrics[key] += value / static_cast<double>(updated.size());
    }
  }
  metrics["lr"] = LearningRate(step);
  metrics["update_s"] = Seconds(started);
  metrics["images_per_s"] = static_cast<double>(batch.size()) / Seconds(started);
  history_.push_back(metrics);
  DRAY_RETURN_IF_ERROR(WriteMetrics(step, metrics));
  if (!SamplesDue(step)) return metrics;
  // The inputs, what they should become, and what the model makes of them
  // now (VAE: the inputs and their reconstructions).
  DRAY_ASSIGN_OR_RETURN(DataProto edited, workers_->Edit(batch, vae));
  DRAY_ASSIGN_OR_RETURN(const std::vector<Image>* outputs, edited.GetRows<Image>(kEditedColumn));
  std::vector<SampleRow> grid;
  const std::vector<const TrainPrompt*> prompts = sampler_->PromptsOf(step);
  for (size_t p = 0; p < prompts.size(); ++p) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor output, DecodeImageRow((*outputs)[p]));
    const TrainPrompt& prompt = *prompts[p];
    grid.push_back(
        vae ? SampleRow{prompt.pixels, {output}, {"reconstruction"}}
            : SampleRow{prompt.pixels, {prompt.target_pixels, output}, {"target", "model"}});
  }
  DRAY_RETURN_IF_ERROR(WriteSamples(step, grid));
  return metrics;
}

absl::StatusOr<std::map<std::string, double>> FlowGrpoTrainer::GrpoStep(int64_t step) {
  std::map<std::string, double> metrics = {{"step", static_cast<double>(step)}};
  const absl::Time started = absl::Now();
  DRAY_ASSIGN_OR_RETURN(DataProto rows, RolloutBatch(step));
  DRAY_ASSIGN_OR_RETURN(DataProto rollout, workers_->Rollout(rows, options_.on_rollout_progress));
  metrics["rollout_s"] = Seconds(started);

  const absl::Time rewarding = absl::Now();
  DRAY_ASSIGN_OR_RETURN(std::vector<double> rewards, Rewards(step, rollout, rows, metrics));
  std::vector<std::string> groups;
  for (const TrainPrompt* prompt : sampler_->PromptsOf(step))
    groups.insert(groups.end(), config_.group_size, prompt->group());
  const at::Tensor reward_tensor = at::tensor(rewards, at::kDouble);
  DRAY_ASSIGN_OR_RETURN(at::Tensor advantages,
                        advantages_(groups, reward_tensor, {config_.global_std}));
  metrics["reward_mean"] = reward_tensor.mean().item<double>();
  metrics["reward_std"] = reward_tensor.std(/*unbiased=*/false).item<double>();
  metrics["advantage_abs_mean"] = advantages.abs().mean().item<double>();
  int64_t tied = 0;
  for (int64_t g = 0; g < config_.prompts_per_step; ++g) {
    const at::Tensor group = reward_tensor.narrow(0, g * config_.group_size, config_.group_size);
    tied += (group == group[0]).all().item<bool>() ? 1 : 0;
  }
  metrics["zero_std_ratio"] = static_cast<double>(tied) / config_.prompts_per_step;
  metrics["reward_s"] = Seconds(rewarding);

  // The trained window steps: a seeded timestep_fraction of them.
  DRAY_ASSIGN_OR_RETURN(at::Tensor timesteps, rollout.GetTensor(kTimestepsColumn));
  const int64_t window = timesteps.size(1);
  const std::vector<int64_t> train_steps = sampler_->TrainedSteps(step, window);
  const double lr = LearningRate(step);
  metrics["lr"] = lr;

  const absl::Time updating = absl::Now();
  DRAY_ASSIGN_OR_RETURN(DataProto batch, rows.Union(rollout));
  DRAY_RETURN_IF_ERROR(batch.AddTensor(kAdvantagesColumn, advantages));
  batch.SetMeta("train_steps", Json{nlohmann::json(train_steps).dump()});
  batch.SetMeta("lr", lr);
  std::map<std::string, double> update_sums;
  for (int64_t epoch = 0; epoch < config_.num_inner_epochs; ++epoch) {
    // Shuffled within each rank's share, as flow_grpo shuffles within each
    // process: a row stays where it was sampled, whose encodings it reuses.
    DRAY_ASSIGN_OR_RETURN(
        DataProto shuffled,
        batch.Reorder(sampler_->UpdateOrder(step, epoch, batch.size(), workers_->world_size())));
    absl::StatusOr<std::vector<DataProto>> updated = workers_->UpdateActor(shuffled);
    if (updated.status().code() == absl::StatusCode::kDataLoss && config_.on_nan == "skip") {
      Log("train", absl::StrCat("skipping step ", step, ": ", updated.status().message()));
      metrics["skipped"] = 1;
      break;
    }
    DRAY_RETURN_IF_ERROR(updated.status());
    for (const DataProto& rank : *updated) {
      for (const auto& [key, value] : rank.meta_info()) {
        if (const double* number = std::get_if<double>(&value))
          update_sums[key] +=
              *number / static_cast<double>(updated->size() * config_.num_inner_epochs);
      }
    }
  }
  for (const auto& [key, value] : update_sums) metrics[key] = value;
  metrics["update_s"] = Seconds(updating);
  metrics["images_per_s"] = static_cast<double>(rows.size()) / Seconds(started);
  history_.push_back(metrics);
  DRAY_RETURN_IF_ERROR(WriteMetrics(step, metrics));
  if (SamplesDue(step)) DRAY_RETURN_IF_ERROR(WriteRolloutSamples(step, rollout, rewards));
  return metrics;
}

bool FlowGrpoTrainer::SamplesDue(int64_t step) const {
  return step % config_.sample_every == 0 || step + 1 == config_.total_steps;
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
  auto series = [&](const char* key, const char* name, Rgb color) {
    Series s{name, color, {}, {}};
    for (const auto& m : history_) {
      auto found = m.find(key);
      s.x.push_back(m.at("step"));
      s.y.push_back(found == m.end() ? NAN : found->second);
    }
    return s;
  };
  std::vector<at::Tensor> charts;
  if (config_.sft()) {
    charts.push_back(
        LineChart("flow-matching loss", {series("loss", "loss", {40, 90, 200})}, 720, 260));
  } else if (config_.vae()) {
    charts.push_back(LineChart("reconstruction RMSE (0-255)",
                               {series("reconstruction_rmse", "rmse", {40, 90, 200})}, 720, 260));
  } else {
    charts.push_back(LineChart("reward", {series("reward_mean", "mean", {200, 50, 40})}, 720, 260));
    charts.push_back(LineChart("loss",
                               {series("policy_loss", "policy", {40, 90, 200}),
                                series("approx_kl", "approx_kl", {60, 160, 60})},
                               720, 260));
  }
  return WritePngFile(config_.save_dir + "/curves.png", StackVertically(charts));
}

absl::Status FlowGrpoTrainer::WriteSamples(int64_t step, const std::vector<SampleRow>& grid) {
  return WritePngFile(absl::StrCat(config_.save_dir, "/samples/step_", step, ".png"),
                      SampleGrid(grid, 96));
}

absl::Status FlowGrpoTrainer::WriteRolloutSamples(int64_t step, const DataProto& rollout,
                                                  const std::vector<double>& rewards) {
  DRAY_ASSIGN_OR_RETURN(const std::vector<Image>* outputs, rollout.GetRows<Image>(kEditedColumn));
  std::vector<SampleRow> grid;
  const std::vector<const TrainPrompt*> prompts = sampler_->PromptsOf(step);
  for (size_t p = 0; p < prompts.size(); ++p) {
    SampleRow row{prompts[p]->pixels, {}, {}};
    for (int64_t g = 0; g < config_.group_size; ++g) {
      const size_t i = p * config_.group_size + g;
      DRAY_ASSIGN_OR_RETURN(at::Tensor output, DecodeImageRow((*outputs)[i]));
      row.outputs.push_back(output);
      row.captions.push_back(absl::StrFormat("%.3f", rewards[i]));
    }
    grid.push_back(std::move(row));
  }
  return WriteSamples(step, grid);
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

absl::Status FlowGrpoTrainer::RestartWorkers(const absl::Status& cause) {
  ++restarts_;
  Log("train", absl::StrCat("the worker group failed: ", cause.message()));
  Log("train", absl::StrCat("restart ", restarts_, " of ", config_.max_restarts));
  DRAY_RETURN_IF_ERROR(StartWorkers());
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
      if (!health.ok() && restarts_ < config_.max_restarts) {
        DRAY_RETURN_IF_ERROR(RestartWorkers(health));
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
  const std::string line =
      absl::StrFormat("step %d/%d%s  loss %.3g  %.1f img/s  elapsed %s  ETA %s", done,
                      config_.total_steps, reward, metrics.count("loss") ? metrics.at("loss") : NAN,
                      metrics.at("images_per_s"), Duration(elapsed), Duration(eta));
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
