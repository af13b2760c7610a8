#include "workers/bench/edit_bench.h"

#include <ATen/ATen.h>
#include <grpcpp/client_context.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "dray/v1/image_edit.grpc.pb.h"
#include "runtime/rpc/grpc_util.h"
#include "workers/edit/image_edit_controller.h"
#include "workers/edit/image_edit_server.h"
#include "workers/image/image_codec.h"
#include "workers/pipeline/edit_batch.h"

namespace dray {
namespace {

constexpr int kBatchRows = 8;

// StartController starts the tiny model at image_size^2 with `steps` steps,
// with guidance (two transformer passes a step, as real edits run).
absl::StatusOr<std::unique_ptr<ImageEditController>> StartController(
    const EditBenchOptions& options, int workers, int image_size, int steps) {
  DRAY_ASSIGN_OR_RETURN(
      ImageEditConfig config,
      ImageEditConfig::Load("", {absl::StrCat("worker.image_edit.image_size=", image_size),
                                 absl::StrCat("worker.image_edit.num_inference_steps=", steps),
                                 "worker.image_edit.negative_prompt=\" \""}));
  ImageEditController::Options start;
  start.workers = workers;
  start.worker_command = options.worker_command;
  return ImageEditController::Start(config, start);
}

// TestImages: `n` gradients of height x width, PNG-encoded.
absl::StatusOr<std::vector<Bytes>> TestImages(int n, int64_t height = 96, int64_t width = 128) {
  std::vector<Bytes> images;
  for (int i = 0; i < n; ++i) {
    const at::Tensor rgb = at::arange(height * width * 3, at::kLong)
                               .mul(i + 1)
                               .remainder(256)
                               .to(at::kByte)
                               .view({height, width, 3});
    DRAY_ASSIGN_OR_RETURN(std::string png, EncodePng(rgb));
    images.push_back(std::move(png));
  }
  return images;
}

// MixedShapeBatch: kBatchRows rows whose pictures come in four aspect
// ratios, two rows each (every output about the same number of pixels).
absl::StatusOr<DataProto> MixedShapeBatch() {
  std::vector<Bytes> images;
  for (const auto& [height, width] :
       std::vector<std::pair<int64_t, int64_t>>{{96, 128}, {128, 96}, {112, 112}, {80, 160}}) {
    DRAY_ASSIGN_OR_RETURN(std::vector<Bytes> two, TestImages(2, height, width));
    images.insert(images.end(), two.begin(), two.end());
  }
  return MakeEditBatch(images, std::vector<std::string>(kBatchRows, "make the sky purple"));
}

absl::StatusOr<double> ImagesPerSecond(ImageEditController& controller, const DataProto& batch,
                                       int repeats) {
  DRAY_RETURN_IF_ERROR(controller.Edit(batch).status());  // warm up
  const absl::Time start = absl::Now();
  for (int i = 0; i < repeats; ++i) DRAY_RETURN_IF_ERROR(controller.Edit(batch).status());
  return batch.size() * repeats / absl::ToDoubleSeconds(absl::Now() - start);
}

// Milliseconds times one run of `run`.
template <typename Fn>
absl::StatusOr<double> Milliseconds(Fn run) {
  const absl::Time start = absl::Now();
  DRAY_RETURN_IF_ERROR(run());
  return absl::ToDoubleMilliseconds(absl::Now() - start);
}

}  // namespace

absl::StatusOr<std::vector<BenchMetric>> RunEditBench(const EditBenchOptions& options) {
  std::vector<BenchMetric> metrics;
  auto emit = [&](std::string name, double value, std::string unit) {
    metrics.push_back({std::move(name), value, std::move(unit)});
    if (options.report) options.report(metrics.back());
  };
  const int repeats = options.quick ? 1 : 3;
  DRAY_ASSIGN_OR_RETURN(std::vector<Bytes> images, TestImages(kBatchRows));
  DRAY_ASSIGN_OR_RETURN(
      DataProto batch,
      MakeEditBatch(images, std::vector<std::string>(kBatchRows, "make the sky purple")));

  // One group at a time: two would share the cores.
  double per_s[3] = {0, 0, 0};
  for (int workers : {1, 2}) {
    DRAY_ASSIGN_OR_RETURN(std::unique_ptr<ImageEditController> controller,
                          StartController(options, workers, /*image_size=*/128, /*steps=*/4));
    DRAY_ASSIGN_OR_RETURN(per_s[workers], ImagesPerSecond(*controller, batch, repeats));
    emit(absl::StrCat("edit_images_per_s_w", workers), per_s[workers], "images/s");
    if (workers > 1) continue;
    // What mixing shapes in a batch costs: one denoising loop per shape.
    DRAY_ASSIGN_OR_RETURN(DataProto mixed, MixedShapeBatch());
    DRAY_ASSIGN_OR_RETURN(double mixed_per_s, ImagesPerSecond(*controller, mixed, repeats));
    emit("edit_mixed_shapes_slowdown_w1", per_s[1] / mixed_per_s, "x");
  }
  emit("edit_speedup_w2", per_s[2] / per_s[1], "x");

  // Latency: a cheap edit (64^2, one step), so the service's few milliseconds
  // stand out of the model's time and this machine's noise.
  DRAY_ASSIGN_OR_RETURN(std::unique_ptr<ImageEditController> one,
                        StartController(options, 1, /*image_size=*/64, /*steps=*/1));
  DRAY_ASSIGN_OR_RETURN(DataProto single,
                        MakeEditBatch({images[0]}, {"make the sky purple"}, {42}));
  ServeOptions serve;
  serve.address = "127.0.0.1:0";
  DRAY_ASSIGN_OR_RETURN(std::unique_ptr<ImageEditServer> server,
                        ImageEditServer::Start(one.get(), serve));
  auto stub =
      v1::ImageEditService::NewStub(CreateDrayChannel(absl::StrCat("127.0.0.1:", server->port())));
  v1::EditImageRequest request;
  request.set_image(std::string(images[0].view()));
  request.set_instruction("make the sky purple");
  request.set_seed(42);
  const int latency_repeats = options.quick ? 11 : 41;
  // Interleaved, so that drift in the machine's speed hits both alike.
  std::vector<double> direct_ms, served_ms, added_ms;
  for (int i = 0; i < latency_repeats; ++i) {
    DRAY_ASSIGN_OR_RETURN(double direct, Milliseconds([&] { return one->Edit(single).status(); }));
    DRAY_ASSIGN_OR_RETURN(double served, Milliseconds([&] {
                            grpc::ClientContext context;
                            SetDeadline(&context, absl::Minutes(5));
                            v1::EditImageResponse response;
                            return ToAbslStatus(stub->Edit(&context, request, &response), "Edit");
                          }));
    direct_ms.push_back(direct);
    served_ms.push_back(served);
    added_ms.push_back(served - direct);
  }
  emit("edit_direct_p50_ms", Median(direct_ms), "ms");
  emit("edit_served_p50_ms", Median(served_ms), "ms");
  emit("serve_overhead_ms", Median(added_ms), "ms");
  return metrics;
}

}  // namespace dray
