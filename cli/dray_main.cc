// dray: the command-line front end. Each subcommand is a thin layer over a
// library: worker processes (runtime/worker_process.h), benchmarks
// (runtime/bench/).
//
//   dray bench [--suite runtime|sharding] [--workers N] [--quick] [--json]
//   dray edit --image IN --instruction TEXT --out OUT [--model DIR] [options]
//   dray init-model --preset tiny|small --out DIR [--seed N]
//   dray parity --reference DIR
//   dray worker --controller=HOST:PORT --roles=A,B   (started by controllers)
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dispatch/status_macros.h"
#include "runtime/allocator.h"
#include "runtime/bench/actor_bench.h"
#include "runtime/worker_process.h"
#include "workers/bench/sharding_bench.h"
#include "workers/edit/image_edit_worker.h"
#include "workers/image/image_codec.h"
#include "workers/models/qwen_image/edit_pipeline.h"
#include "workers/models/qwen_image/model.h"
#include "workers/models/qwen_image/parity.h"

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
  return classes;
}

void PrintMetric(const BenchMetric& metric, bool json) {
  if (json) {
    std::printf("{\"name\": \"%s\", \"value\": %.6g, \"unit\": \"%s\"}\n", metric.name.c_str(),
                metric.value, metric.unit.c_str());
  } else {
    std::printf("%-32s %14.3f  %s\n", metric.name.c_str(), metric.value, metric.unit.c_str());
  }
  std::fflush(stdout);
}

int Bench(const std::string& suite, int workers, bool quick, bool json) {
  if (suite != "runtime" && suite != "sharding") {
    std::fprintf(stderr, "dray bench: unknown suite '%s'; suites: runtime, sharding\n", suite.c_str());
    return 2;
  }
  if (!json) std::printf("%-32s %14s  %s\n", "figure", "value", "unit");
  const BenchReporter report = [json](const BenchMetric& metric) { PrintMetric(metric, json); };
  absl::StatusOr<std::vector<BenchMetric>> metrics;
  if (suite == "sharding") {
    metrics = RunShardingBench(quick, report);
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
    std::fprintf(stderr, "dray bench: %s\n", metrics.status().ToString().c_str());
    return 1;
  }
  return 0;
}

int InitModel(const std::string& preset_name, const std::string& out, uint64_t seed) {
  absl::StatusOr<qwen_image::ModelPreset> preset = qwen_image::PresetNamed(preset_name);
  if (preset.ok() && preset_name == "real") {
    preset = absl::InvalidArgumentError("the real preset (20.4B parameters) is for meta-device checks, not for writing");
  }
  absl::Status written = preset.ok() ? qwen_image::WriteRandomQwenImageModel(out, *preset, seed) : preset.status();
  if (!written.ok()) {
    std::fprintf(stderr, "dray init-model: %s\n", written.ToString().c_str());
    return 1;
  }
  std::printf("wrote a random %s Qwen-Image-Edit model (seed %llu) to %s\n", preset_name.c_str(),
              static_cast<unsigned long long>(seed), out.c_str());
  return 0;
}

// EditFlags: `dray edit`'s options.
struct EditFlags {
  std::string image, instruction, out, model;
  qwen_image::EditOptions options;
  uint64_t seed = 0;
};

// LoadEditModel loads `dir`, or with none the embedded default: the tiny
// model `dray init-model --preset tiny` writes, made in a scratch folder.
absl::StatusOr<qwen_image::QwenImageModel> LoadEditModel(const std::string& dir) {
  const at::TensorOptions float32 = at::TensorOptions().dtype(at::kFloat);
  if (!dir.empty()) return qwen_image::LoadQwenImageModel(dir, float32);
  std::string scratch = (std::filesystem::temp_directory_path() / "dray-tiny-XXXXXX").string();
  if (mkdtemp(scratch.data()) == nullptr) return absl::UnavailableError("cannot create a scratch folder for the tiny model");
  absl::StatusOr<qwen_image::QwenImageModel> model = [&]() -> absl::StatusOr<qwen_image::QwenImageModel> {
    DRAY_RETURN_IF_ERROR(qwen_image::WriteRandomQwenImageModel(scratch, qwen_image::PresetNamed("tiny").value(), 0));
    return qwen_image::LoadQwenImageModel(scratch, float32);
  }();
  std::error_code ignored;
  std::filesystem::remove_all(scratch, ignored);  // the weights are loaded into memory
  return model;
}

int Edit(const EditFlags& flags) {
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "dray edit: %s\n", status.ToString().c_str());
    return 1;
  };
  absl::StatusOr<at::Tensor> image = ReadImageFile(flags.image);
  if (!image.ok()) return fail(image.status());
  absl::StatusOr<qwen_image::QwenImageModel> model = LoadEditModel(flags.model);
  if (!model.ok()) return fail(model.status());
  const qwen_image::EditOptions& options = flags.options;
  std::fprintf(stderr, "dray edit: model %s, %d steps, image_size %lld, true_cfg_scale %g%s, seed %llu\n",
               flags.model.empty() ? "tiny (embedded default)" : flags.model.c_str(), options.num_inference_steps,
               static_cast<long long>(options.image_size), options.true_cfg_scale,
               options.negative_prompt ? "" : " (off: no negative prompt)", static_cast<unsigned long long>(flags.seed));
  qwen_image::QwenImageEditPipeline pipeline(*std::move(model));
  absl::StatusOr<std::vector<at::Tensor>> edited =
      pipeline.Edit({{*image, flags.instruction, flags.seed}}, options, [](int step, int steps) {
        std::fprintf(stderr, "\rdenoising: step %d/%d", step, steps);
        if (step == steps) std::fprintf(stderr, "\n");
      });
  if (!edited.ok()) return fail(edited.status());
  absl::Status written = WritePngFile(flags.out, edited->front());
  if (!written.ok()) return fail(written);
  std::printf("wrote %s (%lldx%lld)\n", flags.out.c_str(), static_cast<long long>(edited->front().size(1)),
              static_cast<long long>(edited->front().size(0)));
  return 0;
}

int Parity(const std::string& reference) {
  absl::StatusOr<std::vector<qwen_image::ParityCase>> cases = qwen_image::ListParityCases(reference);
  if (!cases.ok()) {
    std::fprintf(stderr, "dray parity: %s\n", cases.status().ToString().c_str());
    return 1;
  }
  std::printf("%-20s %-32s %-24s %10s %10s %9s  %s\n", "component", "case", "output", "max_abs", "max_rel",
              "atol/rtol", "result");
  int passed = 0, failed = 0;
  for (const qwen_image::ParityCase& parity_case : *cases) {
    for (const qwen_image::ParityResult& r : qwen_image::RunParityCase(parity_case)) {
      std::printf("%-20s %-32s %-24s %10.3g %10.3g %4.0e/%-4.0e  %s\n", r.component.c_str(), r.case_name.c_str(),
                  r.output.c_str(), r.max_abs, r.max_rel, r.atol, r.rtol,
                  r.passed ? "ok" : r.error.empty() ? "BEYOND TOLERANCE" : ("ERROR: " + r.error).c_str());
      std::fflush(stdout);
      (r.passed ? passed : failed) += 1;
    }
  }
  std::printf("%zu cases: %d outputs within tolerance, %d not\n", cases->size(), passed, failed);
  return failed == 0 ? 0 : 1;
}

int Main(int argc, char** argv) {
  KeepFreedMemoryForReuse();
  CLI::App app{"dray: a C++ runtime for RL and serving of image-edit diffusion models"};
  app.require_subcommand(1);

  CLI::App* bench = app.add_subcommand("bench", "measure the runtime against transport baselines");
  std::string suite = "runtime";
  int workers = 4;
  bool quick = false, json = false;
  bench->add_option("--suite", suite, "what to measure: runtime (actor calls) or sharding (memory, step time)")
      ->capture_default_str();
  bench->add_option("--workers", workers, "worker processes for the batch figures")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  bench->add_flag("--quick", quick, "fewer repetitions");
  bench->add_flag("--json", json, "one JSON object per line: {\"name\", \"value\", \"unit\"}");

  CLI::App* edit = app.add_subcommand("edit", "edit an image by an instruction with Qwen-Image-Edit");
  EditFlags edit_flags;
  std::optional<int> steps;
  std::optional<int64_t> image_size;
  std::string negative_prompt;
  edit->add_option("--image", edit_flags.image, "input image (PNG or JPEG)")->required();
  edit->add_option("--instruction", edit_flags.instruction, "what to change")->required();
  edit->add_option("--out", edit_flags.out, "output PNG")->required();
  edit->add_option("--model", edit_flags.model,
                   "a diffusers Qwen-Image-Edit directory; default: the embedded tiny model (random weights)");
  edit->add_option("--steps", steps, "denoising steps (default 50; 20 on the embedded default)")->check(CLI::PositiveNumber);
  edit->add_option("--image-size", image_size,
                   "work at about this many pixels squared (default 1024; 256 on the embedded default)")
      ->check(CLI::Range(16, 4096));
  edit->add_option("--true-cfg-scale", edit_flags.options.true_cfg_scale, "guidance scale (with --negative-prompt)")
      ->capture_default_str();
  edit->add_option("--negative-prompt", negative_prompt, "what to steer away from; turns guidance on");
  edit->add_option("--seed", edit_flags.seed, "noise seed: the same seed gives the same image")->capture_default_str();
  edit->add_option("--width", edit_flags.options.width, "output width (default: the input's aspect at image-size)");
  edit->add_option("--height", edit_flags.options.height, "output height");

  CLI::App* init = app.add_subcommand("init-model", "write a random Qwen-Image-Edit model directory (diffusers layout)");
  std::string preset = "tiny", out;
  uint64_t seed = 0;
  init->add_option("--preset", preset, "tiny (runs anywhere) or small (real layout, reduced width)")
      ->capture_default_str()
      ->check(CLI::IsMember({"tiny", "small"}));
  init->add_option("--out", out, "directory to write")->required();
  init->add_option("--seed", seed, "random seed: the same seed writes the same weights")->capture_default_str();

  CLI::App* parity = app.add_subcommand("parity", "compare dray with diffusers on reference cases");
  std::string reference;
  parity->add_option("--reference", reference,
                     "a folder laid out like shared/reference/qwen_image (scheduler/, helpers/, model folders)")
      ->required();

  CLI::App* worker = app.add_subcommand("worker", "run a worker process (started by a controller)");
  worker->allow_extras();
  CLI::App* echo = app.add_subcommand("echo-server", "serve a bare gRPC echo (used by bench)");
  int port = 0;
  echo->add_option("--port", port, "port on 127.0.0.1")->required();
  echo->group("");  // internal: hidden from --help

  CLI11_PARSE(app, argc, argv);
  if (*bench) return Bench(suite, workers, quick, json);
  if (*edit) {
    const bool embedded = edit_flags.model.empty();
    edit_flags.options.num_inference_steps = steps.value_or(embedded ? 20 : 50);
    edit_flags.options.image_size = image_size.value_or(embedded ? 256 : 1024);
    if (edit->count("--negative-prompt") > 0) edit_flags.options.negative_prompt = negative_prompt;
    return Edit(edit_flags);
  }
  if (*init) return InitModel(preset, out, seed);
  if (*parity) return Parity(reference);
  if (*worker) {
    std::vector<std::string> args = worker->remaining();
    std::vector<char*> worker_argv = {argv[0]};
    for (std::string& arg : args) worker_argv.push_back(arg.data());
    return WorkerMain(WorkerClasses(), static_cast<int>(worker_argv.size()), worker_argv.data());
  }
  if (*echo) {
    absl::Status served = RunEchoServer(port);
    std::fprintf(stderr, "dray echo-server: %s\n", served.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace dray

int main(int argc, char** argv) { return dray::Main(argc, argv); }
