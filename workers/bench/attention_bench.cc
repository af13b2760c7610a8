#include "workers/bench/attention_bench.h"

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <utility>

#include <torch/csrc/autograd/grad_mode.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/libtorch_compat.h"
#include "base/status_macros.h"
#include "workers/models/layers.h"
#include "workers/models/qwen_image/model.h"
#include "workers/models/qwen_image/transformer.h"
#include "workers/models/qwen_image/vae.h"

namespace dray {
namespace {

// kTextTokens: an edit's text tokens (prompt, template and the condition
// image's vision tokens).
constexpr int64_t kTextTokens = 256;
// kPixelsPerToken: the released model's VAE (8x) and patches (2x2).
constexpr int64_t kPixelsPerToken = 16;

// MedianSeconds: the median of `repetitions` runs of `run` after one to warm up.
double MedianSeconds(int repetitions, const std::function<void()>& run) {
  run();
  std::vector<double> seconds;
  for (int i = 0; i < repetitions; ++i) {
    const absl::Time start = absl::Now();
    run();
    seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  return Median(std::move(seconds));
}

class AttentionBench {
 public:
  AttentionBench(bool quick, BenchReporter report)
      : quick_(quick), repetitions_(quick ? 1 : 3), report_(std::move(report)) {}

  void MeasureAttention() {
    const int64_t n = 2048;
    const at::Tensor a = at::randn({n, n}), b = at::randn({n, n});
    const double matmul_flops =
        2.0 * n * n * n / MedianSeconds(repetitions_, [&] { at::mm(a, b); });
    Emit("matmul_gflops", matmul_flops / 1e9, "GFLOP/s");

    const int64_t side = 1024 / kPixelsPerToken, heads = 2, depth = 128;
    const int64_t tokens = 2 * side * side + kTextTokens;
    // Laid out as the transformer hands them over: [B, S, H, D] permuted.
    auto input = [&] { return at::randn({1, tokens, heads, depth}).permute({0, 2, 1, 3}); };
    const at::Tensor q = input(), k = input(), v = input();
    const double flops = 4.0 * heads * tokens * tokens * depth;
    auto attention = [&](AttentionKernel kernel) {
      AttentionKernelScope scope(kernel);
      torch::NoGradGuard no_grad;
      return flops / MedianSeconds(repetitions_, [&] { DotProductAttention(q, k, v, {}); });
    };
    const double blockwise = attention(AttentionKernel::kBlockwise);
    Emit("attention_gflops", blockwise / 1e9, "GFLOP/s");
    Emit("attention_matmul_share", blockwise / matmul_flops, "of matmul");
    if (kHasFusedAttention) {
      Emit("attention_fused_matmul_share", attention(AttentionKernel::kFused) / matmul_flops,
           "of matmul");
    }
    const at::Tensor trained_q = q.detach().requires_grad_();
    AttentionKernelScope scope(AttentionKernel::kBlockwise);
    const double training =
        flops / MedianSeconds(repetitions_, [&] { DotProductAttention(trained_q, k, v, {}); });
    Emit("attention_training_slowdown", blockwise / training, "x");
  }

  absl::Status MeasureSteps() {
    torch::NoGradGuard no_grad;
    DRAY_ASSIGN_OR_RETURN(qwen_image::ModelPreset preset, qwen_image::PresetNamed("embedded"));
    qwen_image::QwenImageTransformer model(preset.transformer);
    for (at::Tensor& parameter : model->parameters()) parameter.normal_(0, 0.02);
    const int64_t batch = 2;  // the prompt and the negative prompt
    for (int64_t pixels :
         quick_ ? std::vector<int64_t>{256, 512} : std::vector<int64_t>{256, 512, 1024}) {
      const qwen_image::ImageShape image = {1, pixels / kPixelsPerToken, pixels / kPixelsPerToken};
      const at::Tensor latents =
          at::randn({batch, 2 * image[1] * image[2], preset.transformer.in_channels});
      const at::Tensor text =
          at::randn({batch, kTextTokens, preset.transformer.joint_attention_dim});
      const at::Tensor timestep = at::full({batch}, 0.5);
      const std::vector<qwen_image::SampleImages> images(batch, {image, image});
      absl::Status status;
      const double seconds = MedianSeconds(repetitions_, [&] {
        status.Update(model->forward(latents, text, {}, timestep, images).status());
      });
      DRAY_RETURN_IF_ERROR(status);
      Emit(absl::StrCat("step_ms_", pixels), seconds * 1e3, "ms");
    }
    return absl::OkStatus();
  }

  // MeasureVae: one image of each size through the embedded model's VAE,
  // each way, to set beside the steps.
  absl::Status MeasureVae() {
    torch::NoGradGuard no_grad;
    DRAY_ASSIGN_OR_RETURN(qwen_image::ModelPreset preset, qwen_image::PresetNamed("embedded"));
    qwen_image::AutoencoderKLQwenImage vae(preset.vae);
    for (at::Tensor& parameter : vae->parameters()) parameter.normal_(0, 0.02);
    const int64_t scale = preset.vae.spatial_compression();
    for (int64_t pixels : {256, 512}) {
      const at::Tensor image = at::rand({1, 3, 1, pixels, pixels}) * 2 - 1;
      const at::Tensor latents =
          at::randn({1, preset.vae.z_dim, 1, pixels / scale, pixels / scale});
      absl::Status status;
      const double encode =
          MedianSeconds(repetitions_, [&] { status.Update(vae->Encode(image).status()); });
      const double decode =
          MedianSeconds(repetitions_, [&] { status.Update(vae->Decode(latents).status()); });
      DRAY_RETURN_IF_ERROR(status);
      Emit(absl::StrCat("vae_encode_ms_", pixels), encode * 1e3, "ms");
      Emit(absl::StrCat("vae_decode_ms_", pixels), decode * 1e3, "ms");
    }
    return absl::OkStatus();
  }

  std::vector<BenchMetric> metrics() && { return std::move(metrics_); }

 private:
  void Emit(std::string name, double value, std::string unit) {
    metrics_.push_back({std::move(name), value, std::move(unit)});
    if (report_) report_(metrics_.back());
  }

  bool quick_;
  int repetitions_;
  BenchReporter report_;
  std::vector<BenchMetric> metrics_;
};

}  // namespace

absl::StatusOr<std::vector<BenchMetric>> RunAttentionBench(bool quick,
                                                           const BenchReporter& report) {
  AttentionBench bench(quick, report);
  bench.MeasureAttention();
  DRAY_RETURN_IF_ERROR(bench.MeasureSteps());
  DRAY_RETURN_IF_ERROR(bench.MeasureVae());
  return std::move(bench).metrics();
}

}  // namespace dray
