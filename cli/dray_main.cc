// dray: the command-line front end. Each subcommand is a thin layer over a
// library: worker processes (runtime/worker/worker_process.h), benchmarks
// (runtime/bench/), image editing (workers/edit/, through edit_commands.h).
//
//   dray bench [--suite runtime|sharding|edit|train|serve|gpu|plan] [--workers N] [--quick]
//              [--json] [--plot PNG]
//   dray edit --image IN --instruction TEXT --out OUT [--server HOST:PORT] [options]
//   dray serve [--config FILE] [worker.image_edit.KEY=VALUE ...] [--workers N] [--port P]
//   dray train|serve ... --nodes N --listen HOST:PORT --token-file F   (workers on node agents)
//   dray node --controller=HOST:PORT --token-file=F                    (one per node)
//   dray init-model --preset tiny|embedded|small|flux-tiny [--pipeline edit|edit-plus] --out DIR
//       [--seed N]
//   dray parity --reference DIR
//   dray plan --model flux-real|DIR [--config FILE] [--world-size N] [options]  (memory per rank)
//   dray worker --controller=HOST:PORT --roles=A,B   (started by controllers)
//   dray --version                                    (LibTorch, CUDA, the GPUs it sees)
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/synchronization/mutex.h"
#include "base/cuda_devices.h"
#include "base/libtorch_compat.h"
#include "base/log.h"
#include "cli/cluster_commands.h"
#include "cli/edit_commands.h"
#include "cli/plan_command.h"
#include "cli/train_command.h"
#include "runtime/bench/actor_bench.h"
#include "runtime/process/allocator.h"
#include "runtime/security/tls.h"
#include "runtime/worker/worker_process.h"
#include "workers/bench/edit_bench.h"
#include "workers/bench/gpu_bench.h"
#include "workers/bench/plan_bench.h"
#include "workers/bench/serve_bench.h"
#include "workers/bench/sharding_bench.h"
#include "workers/bench/train_bench.h"
#include "workers/edit/image_edit_worker.h"
#include "workers/models/flux/model.h"
#include "workers/models/qwen_image/model.h"
#include "workers/parity/parity.h"
#include "workers/train/flow_grpo_worker.h"
#include "workers/train/reward_worker.h"

namespace dray {
namespace {

// SelfPath returns the path of this executable, so it can start copies of itself.
std::string SelfPath() {
  char path[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  return n > 0 ? std::string(path, n) : std::string("dray");
}

WorkerClassRegistry WorkerClasses() {
  WorkerClassRegistry classes;
  RegisterBenchWorkers(&classes);
  classes.Add<QwenImageEditWorker>(kImageEditRole);
  classes.Add<FlowGrpoWorker>(kFlowGrpoRole);
  classes.Add<RewardWorker>(kRewardRole);
  return classes;
}

void PrintMetric(const BenchMetric& metric, bool json) {
  if (json) {
    std::printf("{\"name\": \"%s\", \"value\": %.6g, \"unit\": \"%s\"}\n", metric.name.c_str(),
                metric.value, metric.unit.c_str());
  } else {
    std::printf("%-48s %14.3f  %s\n", metric.name.c_str(), metric.value, metric.unit.c_str());
  }
  std::fflush(stdout);
}

int Bench(const std::string& suite, int workers, bool quick, bool json, const std::string& plot) {
  if (suite != "runtime" && suite != "sharding" && suite != "edit" && suite != "train" &&
      suite != "serve" && suite != "gpu" && suite != "plan") {
    std::fprintf(stderr,
                 "dray bench: unknown suite '%s'; suites: runtime, sharding, edit, train, serve, "
                 "gpu, plan\n",
                 suite.c_str());
    return 2;
  }
  if (!json) std::printf("%-48s %14s  %s\n", "figure", "value", "unit");
  const BenchReporter report = [json](const BenchMetric& metric) { PrintMetric(metric, json); };
  absl::StatusOr<std::vector<BenchMetric>> metrics;
  if (suite == "sharding") {
    metrics = RunShardingBench(quick, report);
  } else if (suite == "edit") {
    metrics = RunEditBench({{SelfPath(), "worker"}, quick, report});
  } else if (suite == "train") {
    metrics = RunTrainBench({{SelfPath(), "worker"}, quick, report, plot});
  } else if (suite == "serve") {
    metrics = RunServeBench({SelfPath(), quick, report});
  } else if (suite == "gpu") {
    metrics = RunGpuBench({quick, report});
  } else if (suite == "plan") {
    metrics = RunPlanBench(quick, report);
  } else {
    ActorBenchOptions options;
    options.worker_command = {SelfPath(), "worker"};
    options.echo_server_command = {SelfPath(), "echo-server"};
    options.workers = workers;
    options.quick = quick;
    options.report = report;
    metrics = RunActorBench(options);
  }
  if (!metrics.ok()) {
    Log("bench", metrics.status().ToString());
    return 1;
  }
  return 0;
}

// InitFluxModel writes a FLUX.1 Kontext model directory of `preset_name`.
int InitFluxModel(const std::string& preset_name, const std::string& out, uint64_t seed) {
  absl::StatusOr<flux::FluxPreset> preset = flux::FluxPresetNamed(preset_name);
  const absl::Status written =
      preset.ok() ? flux::WriteRandomFluxKontextModel(out, *preset, seed) : preset.status();
  if (!written.ok()) {
    Log("init-model", written.ToString());
    return 1;
  }
  std::printf("wrote a random %s FLUX.1 Kontext model (seed %llu) to %s\n", preset_name.c_str(),
              static_cast<unsigned long long>(seed), out.c_str());
  return 0;
}

int InitModel(const std::string& preset_name, const std::string& pipeline, const std::string& out,
              uint64_t seed) {
  if (preset_name == "flux-tiny") {
    if (!pipeline.empty()) {
      Log("init-model",
          "--pipeline applies to Qwen-Image-Edit presets; flux-tiny writes a "
          "FluxKontextPipeline directory");
      return 1;
    }
    return InitFluxModel(preset_name, out, seed);
  }
  absl::StatusOr<qwen_image::ModelPreset> preset = qwen_image::PresetNamed(preset_name);
  if (preset.ok() && !pipeline.empty()) {
    preset->pipeline = pipeline == "edit-plus" ? qwen_image::EditPipelineKind::kEditPlus
                                               : qwen_image::EditPipelineKind::kEdit;
  }
  if (preset.ok() && preset_name == "real") {
    preset = absl::InvalidArgumentError(
        "the real preset (20.4B parameters) is for meta-device checks, not for writing");
  }
  absl::Status written =
      preset.ok() ? qwen_image::WriteRandomQwenImageModel(out, *preset, seed) : preset.status();
  if (!written.ok()) {
    Log("init-model", written.ToString());
    return 1;
  }
  const bool plus = preset->pipeline == qwen_image::EditPipelineKind::kEditPlus;
  std::printf("wrote a random %s Qwen-Image-Edit%s model (seed %llu) to %s\n", preset_name.c_str(),
              plus ? " (Edit-Plus: 2509/2511)" : "", static_cast<unsigned long long>(seed),
              out.c_str());
  return 0;
}

int Parity(const std::string& reference) {
  absl::StatusOr<std::vector<ParityCase>> cases = ListParityCases(reference);
  if (!cases.ok()) {
    Log("parity", cases.status().ToString());
    return 1;
  }
  std::printf("%-20s %-40s %-40s %10s %10s %9s  %s\n", "component", "case", "output", "max_abs",
              "max_rel", "atol/rtol", "result");
  int passed = 0, failed = 0;
  for (const ParityCase& parity_case : *cases) {
    for (const ParityResult& r : RunParityCase(parity_case)) {
      std::printf("%-20s %-40s %-40s %10.3g %10.3g %4.0e/%-4.0e  %s\n", r.component.c_str(),
                  r.case_name.c_str(), r.output.c_str(), r.max_abs, r.max_rel, r.atol, r.rtol,
                  r.passed          ? "ok"
                  : r.error.empty() ? "BEYOND TOLERANCE"
                                    : ("ERROR: " + r.error).c_str());
      std::fflush(stdout);
      (r.passed ? passed : failed) += 1;
    }
  }
  std::printf("%zu cases: %d outputs within tolerance, %d not\n", cases->size(), passed, failed);
  return failed == 0 ? 0 : 1;
}

// VersionText: what `dray --version` prints.
std::string VersionText() {
  return "dray, built with LibTorch " + kLibTorchVersion + "\n" + DescribeCudaDevices().summary;
}

int Main(int argc, char** argv) {
  // As in WorkerMain: no deadlock bookkeeping on every Mutex lock.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  CLI::App app{"dray: a C++ runtime for RL and serving of image-edit diffusion models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", VersionText,
                       "print the LibTorch and CUDA this dray was built with and the GPUs it sees");

  CLI::App* bench = app.add_subcommand("bench", "measure the runtime against transport baselines");
  std::string suite = "runtime";
  int workers = 4;
  bool quick = false, json = false;
  std::string plot;
  bench
      ->add_option("--suite", suite,
                   "what to measure: runtime (actor calls), sharding (memory, step time), edit "
                   "(images/s, serving), train (RL step time and its phases), serve (dray "
                   "serve under load), gpu (the transformer's TFLOP/s and step time on the "
                   "first CUDA device, small shapes on CPU without one) or plan (dray plan's "
                   "memory predictions against measured peaks)")
      ->capture_default_str();
  bench->add_option("--workers", workers, "worker processes for the batch figures")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  bench->add_flag("--quick", quick, "fewer repetitions and smaller models (CI's check)");
  bench->add_flag("--json", json, "one JSON object per line: {\"name\", \"value\", \"unit\"}");
  bench->add_option("--plot", plot,
                    "train: write the algorithms' reward against wall-clock seconds here (PNG)");

  EditCommands edit_commands(app, SelfPath());
  TrainCommand train_command(app, SelfPath());
  NodeCommand node_command(app, SelfPath());
  PlanCommand plan_command(app);

  CLI::App* init = app.add_subcommand(
      "init-model",
      "write a random Qwen-Image-Edit or FLUX.1 Kontext model directory (diffusers layout)");
  std::string preset = "tiny", pipeline, out;
  uint64_t seed = 0;
  init->add_option("--preset", preset,
                   "tiny (runs anywhere), embedded (the embedded model's shapes), small (real "
                   "layout, reduced width): Qwen-Image-Edit; flux-tiny: FLUX.1 Kontext (runs "
                   "anywhere)")
      ->capture_default_str()
      ->check(CLI::IsMember({"tiny", "embedded", "small", "flux-tiny"}));
  init->add_option("--pipeline", pipeline,
                   "edit (Qwen-Image-Edit: one input image) or edit-plus (2509/2511: one to "
                   "three; model_index.json names QwenImageEditPlusPipeline); default: the "
                   "preset's (edit-plus for embedded, edit otherwise)")
      ->check(CLI::IsMember({"edit", "edit-plus"}));
  init->add_option("--out", out, "directory to write")->required();
  init->add_option("--seed", seed, "random seed: the same seed writes the same weights")
      ->capture_default_str();

  CLI::App* parity = app.add_subcommand(
      "parity", "compare dray with diffusers, transformers and flow_grpo on reference cases");
  std::string reference;
  parity
      ->add_option("--reference", reference,
                   "a folder laid out like tests/data/reference/qwen_image (scheduler/, helpers/, "
                   "model folders), tests/data/reference/qwen2_vl (model folders, "
                   "image_processor/) or tests/data/reference/flow_grpo (cases.json and its "
                   "safetensors), or a folder of such folders")
      ->required();

  CLI::App* worker = app.add_subcommand("worker", "run a worker process (started by a controller)");
  worker->allow_extras();
  CLI::App* echo = app.add_subcommand("echo-server", "serve a bare gRPC echo (used by bench)");
  int port = 0;
  echo->add_option("--port", port, "port on 127.0.0.1")->required();
  echo->group("");  // internal: hidden from --help

  CLI11_PARSE(app, argc, argv);
  // Only a command's own flags put it on TLS; its workers inherit that.
  if (!*worker) ForgetInheritedTls();
  // Batch movers keep freed memory for the next batch (workers do so in
  // WorkerMain); a serving controller gives it back after a burst.
  if (*bench || *echo) KeepFreedMemoryForReuse();
  if (*bench) return Bench(suite, workers, quick, json, plot);
  if (std::optional<int> code = edit_commands.Run()) return *code;
  if (std::optional<int> code = train_command.Run()) return *code;
  if (std::optional<int> code = node_command.Run()) return *code;
  if (std::optional<int> code = plan_command.Run()) return *code;
  if (*init) return InitModel(preset, pipeline, out, seed);
  if (*parity) return Parity(reference);
  if (*worker) {
    std::vector<std::string> args = worker->remaining();
    std::vector<char*> worker_argv = {argv[0]};
    for (std::string& arg : args) worker_argv.push_back(arg.data());
    return WorkerMain(WorkerClasses(), static_cast<int>(worker_argv.size()), worker_argv.data());
  }
  if (*echo) {
    absl::Status served = RunEchoServer(port);
    Log("echo-server", served.ToString());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace dray

int main(int argc, char** argv) { return dray::Main(argc, argv); }
