// A complete dray program: one binary that is both the controller and (when
// started by it with `worker`) the worker processes.
//
//   bazel run //examples:hello_workers
#include <unistd.h>

#include <ATen/ATen.h>

#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

#include "runtime/controller/worker_group.h"
#include "runtime/worker/worker.h"
#include "runtime/worker/worker_process.h"

// 1. A worker class: methods registered with their dispatch modes.
class SquareWorker : public dray::Worker {
 public:
  SquareWorker() {
    Def("init_model", &SquareWorker::InitModel, {dray::kOneToAll});
    Def("square", &SquareWorker::Square, {dray::kDpComputeProto});
  }

  // ONE_TO_ALL: every rank receives the same input.
  absl::StatusOr<dray::DataProto> InitModel(const dray::DataProto& config) {
    absl::StatusOr<double> scale = config.GetMeta<double>("scale");
    if (!scale.ok()) return scale.status();
    scale_ = *scale;
    return dray::DataProto::Make({}, {}, {{"rank", int64_t{rank()}}});
  }

  // DP_COMPUTE_PROTO: each rank receives a slice of the batch.
  absl::StatusOr<dray::DataProto> Square(const dray::DataProto& batch) {
    absl::StatusOr<at::Tensor> x = batch.GetTensor("x");
    if (!x.ok()) return x.status();
    return dray::DataProto::Make({{"y", *x * *x * scale_}},
                                 {{"rank", std::vector<int64_t>(batch.size(), rank())}});
  }

 private:
  double scale_ = 1;
};

int main(int argc, char** argv) {
  // 2. Worker processes: the controller starts this binary with `worker`.
  if (argc > 1 && std::strcmp(argv[1], "worker") == 0) {
    dray::WorkerClassRegistry classes;
    classes.Add<SquareWorker>("square");
    return dray::WorkerMain(classes, argc - 1, argv + 1);
  }

  // 3. The controller: a group of 2 worker processes hosting "square".
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return 1;
  dray::WorkerGroupOptions options;
  options.command = {std::string(self, n), "worker"};
  options.roles = {"square"};
  auto group = dray::WorkerGroup::Create({/*nodes=*/1, /*workers_per_node=*/2}, options);
  if (!group.ok()) {
    std::fprintf(stderr, "%s\n", group.status().ToString().c_str());
    return 1;
  }

  auto config = dray::DataProto::Make({}, {}, {{"scale", 0.5}}).value();
  auto ranks = (*group)->Call("init_model", {config});
  if (!ranks.ok()) return 1;
  std::printf("init_model answered by %zu ranks\n", ranks->size());

  // 5 rows over 2 workers: padded to 6, split, squared, joined, unpadded.
  auto batch = dray::DataProto::Make({{"x", at::arange(5, at::kDouble)}}).value();
  auto result = (*group)->Call("square", {batch});
  if (!result.ok()) {
    std::fprintf(stderr, "%s\n", result.status().ToString().c_str());
    return 1;
  }
  const at::Tensor y = (*result)[0].GetTensor("y").value();
  const auto& rank = *(*result)[0].GetRows<int64_t>("rank").value();
  for (int64_t i = 0; i < y.size(0); ++i) {
    std::printf("x=%lld  y=%g  (rank %lld)\n", static_cast<long long>(i), y[i].item<double>(),
                static_cast<long long>(rank[i]));
  }
  return 0;
}
