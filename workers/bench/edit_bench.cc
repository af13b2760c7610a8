#include "workers/bench/edit_bench.h"

#include <ATen/ATen.h>
#include <grpcpp/client_context.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "dray/v1/image_edit.grpc.pb.h"
#include "runtime/process/subprocess.h"
#include "runtime/rpc/grpc_util.h"
#include "workers/bench/attention_bench.h"
#include "workers/edit/image_edit_controller.h"
#include "workers/edit/image_edit_server.h"
#include "workers/image/image_codec.h"
#include "workers/models/qwen_image/edit_pipeline.h"
#include "workers/models/qwen_image/embedded_model.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/train/synthetic_edit_score.h"

namespace dray {
namespace {

constexpr int kBatchRows = 8;

// StartController starts the embedded model at image_size^2 with `steps`
// steps, with guidance (two transformer passes a step, as real edits run),
// and `overrides`; each worker computes on `threads` threads (0: its share
// of the machine's cores).
absl::StatusOr<std::unique_ptr<ImageEditController>> StartController(
    const EditBenchOptions& options, int workers, int image_size, int steps,
    std::vector<std::string> overrides = {}, int threads = 0) {
  overrides.insert(overrides.end(), {absl::StrCat("worker.image_edit.image_size=", image_size),
                                     absl::StrCat("worker.image_edit.num_inference_steps=", steps),
                                     "worker.image_edit.negative_prompt=\" \""});
  DRAY_ASSIGN_OR_RETURN(ImageEditConfig config, ImageEditConfig::Load("", overrides));
  ImageEditController::Options start;
  start.workers = workers;
  start.worker_command = options.worker_command;
  if (threads > 0) start.env = {{"OMP_NUM_THREADS", absl::StrCat(threads)}};
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

// SingleEdit: one guided edit at image_size^2 on `workers` workers spread
// by `overrides`, each on `threads` threads (0: its share of the cores).
struct SingleEdit {
  int workers = 1;
  std::vector<std::string> overrides;
  int threads = 0;
  int image_size = 256;
  int steps = 20;
};

// EditLatency: one edit's median latency, and the median time between its
// denoising steps (progress reports: what a spread edit parallelizes, apart
// from the text encoder and the VAE every rank runs whole).
struct EditLatency {
  double ms = 0, step_ms = 0;
  DataProto edited;  // the last edit's result
};

absl::StatusOr<EditLatency> MeasureEdit(const EditBenchOptions& options, const SingleEdit& edit,
                                        const DataProto& row) {
  DRAY_ASSIGN_OR_RETURN(std::unique_ptr<ImageEditController> controller,
                        StartController(options, edit.workers, edit.image_size, edit.steps,
                                        edit.overrides, edit.threads));
  DRAY_RETURN_IF_ERROR(controller->Edit(row).status());  // warm up
  std::vector<double> ms, step_ms;
  DataProto edited;
  for (int i = 0; i < (options.quick ? 1 : 3); ++i) {
    absl::Mutex mu;
    std::vector<absl::Time> steps;
    const absl::Time start = absl::Now();
    DRAY_ASSIGN_OR_RETURN(edited, controller->Edit(row, std::nullopt, [&](int64_t, int64_t) {
      absl::MutexLock lock(&mu);
      steps.push_back(absl::Now());
    }));
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    absl::MutexLock lock(&mu);
    for (size_t k = 1; k < steps.size(); ++k)
      step_ms.push_back(absl::ToDoubleMilliseconds(steps[k] - steps[k - 1]));
  }
  if (step_ms.empty()) return absl::InternalError("an edit of 2 steps or more reported fewer");
  return EditLatency{Median(std::move(ms)), Median(std::move(step_ms)), std::move(edited)};
}

using Emit = std::function<void(std::string name, double value, std::string unit)>;

// EmitSpeedups: `spread` against `one` (both edits, and their steps).
void EmitSpeedups(const Emit& emit, const std::string& name, const EditLatency& one,
                  const EditLatency& spread) {
  emit(absl::StrCat("edit_", name, "_speedup"), one.ms / spread.ms, "x");
  emit(absl::StrCat("edit_", name, "_step_speedup"), one.step_ms / spread.step_ms, "x");
}

// MeasureSingleEdits: one guided edit's latency spread over workers, each
// layout against one worker on the threads each of its workers has (as
// one GPU against several) and against one worker on every core; then
// Ulysses on a sequence long enough to pay for its all-to-alls.
absl::Status MeasureSingleEdits(const EditBenchOptions& options, const DataProto& row,
                                const Emit& emit) {
  SingleEdit edit;
  edit.steps = options.quick ? 2 : 20;
  DRAY_ASSIGN_OR_RETURN(const EditLatency all_cores, MeasureEdit(options, edit, row));
  emit("edit_single_ms_w1", all_cores.ms, "ms");
  emit("edit_step_ms_w1", all_cores.step_ms, "ms");
  std::map<int, EditLatency> one_worker;  // by threads
  const std::string cfg = "worker.image_edit.cfg_parallel_size=2";
  auto ulysses = [](int degree) {
    return absl::StrCat("worker.image_edit.ulysses_degree=", degree);
  };
  for (const auto& [name, workers, overrides] :
       std::vector<std::tuple<std::string, int, std::vector<std::string>>>{
           {"cfg2", 2, {cfg}},
           {"ulysses2", 2, {ulysses(2)}},
           {"cfg2_ulysses2", 4, {cfg, ulysses(2)}},
           {"ulysses4", 4, {ulysses(4)}}}) {
    SingleEdit one = edit;
    one.threads = std::max(1, UsableCores() / workers);
    if (one_worker.count(one.threads) == 0) {
      DRAY_ASSIGN_OR_RETURN(one_worker[one.threads], MeasureEdit(options, one, row));
      emit(absl::StrCat("edit_single_ms_w1_threads", one.threads), one_worker[one.threads].ms,
           "ms");
    }
    SingleEdit spread = edit;
    spread.workers = workers;
    spread.overrides = overrides;
    DRAY_ASSIGN_OR_RETURN(const EditLatency latency, MeasureEdit(options, spread, row));
    emit(absl::StrCat("edit_single_ms_", name), latency.ms, "ms");
    EmitSpeedups(emit, name, one_worker[one.threads], latency);
    emit(absl::StrCat("edit_", name, "_vs_all_cores"), all_cores.ms / latency.ms, "x");
  }
  SingleEdit long_one = edit;
  long_one.image_size = 512;
  long_one.steps = options.quick ? 2 : 4;
  long_one.threads = std::max(1, UsableCores() / 2);
  SingleEdit long_spread = long_one;
  long_spread.workers = 2;
  long_spread.threads = 0;
  long_spread.overrides = {ulysses(2)};
  DRAY_ASSIGN_OR_RETURN(const EditLatency long_alone, MeasureEdit(options, long_one, row));
  DRAY_ASSIGN_OR_RETURN(const EditLatency long_spread_out, MeasureEdit(options, long_spread, row));
  emit("edit_512_single_ms_w1_half_cores", long_alone.ms, "ms");
  emit("edit_512_single_ms_ulysses2", long_spread_out.ms, "ms");
  EmitSpeedups(emit, "512_ulysses2", long_alone, long_spread_out);
  return absl::OkStatus();
}

// PsnrDb: the peak signal-to-noise ratio of `edited`'s image against
// `exact`'s, in dB (100 for the same pixels).
absl::StatusOr<double> PsnrDb(const DataProto& edited, const DataProto& exact) {
  std::vector<at::Tensor> images;
  for (const DataProto* result : {&edited, &exact}) {
    DRAY_ASSIGN_OR_RETURN(const std::vector<Image>* rows, result->GetRows<Image>(kEditedColumn));
    DRAY_ASSIGN_OR_RETURN(at::Tensor rgb, DecodeImage(rows->front().bytes.view()));
    images.push_back(rgb.to(at::kDouble));
  }
  const double mse = (images[0] - images[1]).pow(2).mean().item<double>();
  return mse == 0 ? 100.0 : 10 * std::log10(255.0 * 255.0 / mse);
}

// MeanEditScore: the embedded model's held-out edit score (the share of
// each edit left undone, averaged over the instructions; lower is better)
// with `step_cache`.
absl::StatusOr<double> MeanEditScore(qwen_image::QwenImageEditPipeline& pipeline,
                                     const qwen_image::StepCacheOptions& step_cache) {
  DRAY_ASSIGN_OR_RETURN(std::vector<SyntheticEditScore> scores,
                        ScoreSyntheticEdits(pipeline, {}, step_cache));
  double sum = 0;
  for (const SyntheticEditScore& score : scores) sum += score.remaining;
  return sum / scores.size();
}

// MeasureStepCache: a guided 256^2 edit of `row` (20 steps; 8 and only
// T = 0.2 with --quick) with the step
// cache at several thresholds against the exact one, on one worker: the
// speedup, the PSNR of its image against the exact image, the share of
// passes that reused the later blocks; and the embedded model's edit score
// at each threshold, in this process.
absl::Status MeasureStepCache(const EditBenchOptions& options, const DataProto& row,
                              const Emit& emit) {
  SingleEdit edit;
  edit.steps = options.quick ? 8 : 20;
  DRAY_ASSIGN_OR_RETURN(const EditLatency exact, MeasureEdit(options, edit, row));
  DRAY_ASSIGN_OR_RETURN(ScratchDir embedded, ScratchDir::Create("dray-bench-embedded"));
  DRAY_RETURN_IF_ERROR(qwen_image::WriteEmbeddedModel(embedded.path()));
  DRAY_ASSIGN_OR_RETURN(qwen_image::QwenImageModel model,
                        qwen_image::LoadQwenImageModel(embedded.path(), at::kFloat));
  qwen_image::QwenImageEditPipeline pipeline(std::move(model));
  DRAY_ASSIGN_OR_RETURN(const double exact_score, MeanEditScore(pipeline, {}));
  emit("edit_score_exact", exact_score, "undone");
  std::vector<std::pair<std::string, double>> thresholds = {
      {"010", 0.1}, {"020", 0.2}, {"030", 0.3}, {"050", 0.5}};
  if (options.quick) thresholds = {{"020", 0.2}};
  for (const auto& [name, threshold] : thresholds) {
    SingleEdit cached = edit;
    cached.overrides = {absl::StrCat("worker.image_edit.step_cache_threshold=", threshold)};
    DRAY_ASSIGN_OR_RETURN(const EditLatency latency, MeasureEdit(options, cached, row));
    DRAY_ASSIGN_OR_RETURN(const double psnr, PsnrDb(latency.edited, exact.edited));
    DRAY_ASSIGN_OR_RETURN(const at::Tensor reused, latency.edited.GetTensor(kReusedPassesColumn));
    DRAY_ASSIGN_OR_RETURN(const at::Tensor passes,
                          latency.edited.GetTensor(kTransformerPassesColumn));
    const std::string prefix = absl::StrCat("edit_step_cache", name);
    emit(prefix + "_speedup", exact.ms / latency.ms, "x");
    emit(prefix + "_psnr_db", psnr, "dB");
    emit(prefix + "_reused_share",
         reused.sum().item<double>() / std::max<int64_t>(1, passes.sum().item<int64_t>()),
         "of passes");
    DRAY_ASSIGN_OR_RETURN(const double score, MeanEditScore(pipeline, {threshold, 2}));
    emit(prefix + "_edit_score", score, "undone");
  }
  return absl::OkStatus();
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
  DRAY_ASSIGN_OR_RETURN(std::vector<BenchMetric> metrics,
                        RunAttentionBench(options.quick, options.report));
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

  DRAY_ASSIGN_OR_RETURN(DataProto single,
                        MakeEditBatch({images[0]}, {"make the sky purple"}, {42}));
  DRAY_RETURN_IF_ERROR(MeasureSingleEdits(options, single, emit));
  DRAY_RETURN_IF_ERROR(MeasureStepCache(options, single, emit));

  // Latency: a cheap edit (64^2, one step), so the service's few milliseconds
  // stand out of the model's time and this machine's noise.
  DRAY_ASSIGN_OR_RETURN(std::unique_ptr<ImageEditController> one,
                        StartController(options, 1, /*image_size=*/64, /*steps=*/1));
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
