// dray: the command-line front end. Each subcommand is a thin layer over a
// library: worker processes (runtime/worker_process.h), benchmarks
// (runtime/bench/).
//
//   dray bench [--suite runtime] [--workers N] [--quick] [--json]
//   dray worker --controller=HOST:PORT --roles=A,B   (started by controllers)
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "runtime/allocator.h"
#include "runtime/bench/actor_bench.h"
#include "runtime/worker_process.h"

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
  if (suite != "runtime") {
    std::fprintf(stderr, "dray bench: unknown suite '%s'; suites: runtime\n", suite.c_str());
    return 2;
  }
  if (!json) std::printf("%-32s %14s  %s\n", "figure", "value", "unit");
  ActorBenchOptions options;
  options.worker_command = {SelfPath(), "worker"};
  options.echo_server_command = {SelfPath(), "echo-server"};
  options.workers = workers;
  options.quick = quick;
  options.report = [json](const BenchMetric& metric) { PrintMetric(metric, json); };
  absl::StatusOr<std::vector<BenchMetric>> metrics = RunActorBench(options);
  if (!metrics.ok()) {
    std::fprintf(stderr, "dray bench: %s\n", metrics.status().ToString().c_str());
    return 1;
  }
  return 0;
}

int Main(int argc, char** argv) {
  KeepFreedMemoryForReuse();
  CLI::App app{"dray: a C++ runtime for RL and serving of image-edit diffusion models"};
  app.require_subcommand(1);

  CLI::App* bench = app.add_subcommand("bench", "measure the runtime against transport baselines");
  std::string suite = "runtime";
  int workers = 4;
  bool quick = false, json = false;
  bench->add_option("--suite", suite, "what to measure: runtime")->capture_default_str();
  bench->add_option("--workers", workers, "worker processes for the batch figures")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  bench->add_flag("--quick", quick, "fewer repetitions");
  bench->add_flag("--json", json, "one JSON object per line: {\"name\", \"value\", \"unit\"}");

  CLI::App* worker = app.add_subcommand("worker", "run a worker process (started by a controller)");
  worker->allow_extras();
  CLI::App* echo = app.add_subcommand("echo-server", "serve a bare gRPC echo (used by bench)");
  int port = 0;
  echo->add_option("--port", port, "port on 127.0.0.1")->required();
  echo->group("");  // internal: hidden from --help

  CLI11_PARSE(app, argc, argv);
  if (*bench) return Bench(suite, workers, quick, json);
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
