#include "workers/bench/gpu_bench.h"

#include <ATen/ATen.h>
#include <sys/resource.h>

#include <functional>
#include <string>
#include <utility>

#include <torch/csrc/autograd/grad_mode.h>
#include <torch/cuda.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/cuda_devices.h"
#include "base/exception_message.h"
#include "base/libtorch_compat.h"
#include "base/status_macros.h"
#include "workers/models/layers.h"
#include "workers/models/qwen_image/model.h"
#include "workers/models/qwen_image/transformer.h"

namespace dray {
namespace {

using qwen_image::ImageShape;
using qwen_image::QwenImageTransformer;
using qwen_image::SampleImages;
using qwen_image::TransformerBlock;
using qwen_image::TransformerConfig;

// Setup: what is measured, and where.
struct Setup {
  TransformerConfig config;
  at::TensorOptions options;
  ImageShape image;  // the target's and the condition image's tokens
  int64_t text_tokens = 0;
  int repetitions = 0;
  double peak_tflops = 0;  // the device's dense bf16 peak; 0: not known
  int64_t device_memory = 0;
};

// DenseBf16PeakTflops: NVIDIA's dense (no sparsity) bf16 tensor-core peak
// for the devices dray has the figure of; 0 for others.
double DenseBf16PeakTflops(const std::string& name) {
  if (absl::StrContains(name, "H200")) return 989.4;
  if (absl::StrContains(name, "H100")) return absl::StrContains(name, "PCIe") ? 756.5 : 989.4;
  if (absl::StrContains(name, "A100")) return 312;
  return 0;
}

Setup SetupFor(const CudaDevices& cuda, bool quick) {
  if (cuda.devices.empty()) {
    return {qwen_image::PresetNamed("small").value().transformer,
            at::TensorOptions(at::kFloat),
            {1, 32, 32},
            64,
            quick ? 2 : 5};
  }
  const CudaDevice& device = cuda.devices[0];
  return {TransformerConfig(),  // the released model's
          at::TensorOptions().device(at::kCUDA, 0).dtype(at::kBFloat16),
          {1, 64, 64},  // 1024 x 1024 pixels: 16 x 16 each per token
          256,
          quick ? 5 : 20,
          DenseBf16PeakTflops(device.name),
          device.memory_bytes};
}

int64_t ImageTokens(const Setup& setup) { return 2 * setup.image[1] * setup.image[2]; }

// BlockForwardFlops: one block's matrix products for one sample of S
// tokens, D wide: per token q, k, v and out projections (4 D^2) and the MLP
// (D -> 4D -> D: 8 D^2) of its stream; q k^T and the scores times v
// (2 S^2 D); the two streams' modulations (2 x 6 D^2).
double BlockForwardFlops(const Setup& setup) {
  const double d = setup.config.inner_dim(), s = ImageTokens(setup) + setup.text_tokens;
  return 2.0 * (12 * d * d * s + 2 * s * s * d + 12 * d * d);
}

void Synchronize(const Setup& setup) {
  if (setup.options.device().is_cuda()) torch::cuda::synchronize();
}

// MedianSeconds: the median of setup.repetitions runs of `run` after one to
// warm up, each timed until the device has finished it.
double MedianSeconds(const Setup& setup, const std::function<void()>& run) {
  run();
  Synchronize(setup);
  std::vector<double> seconds;
  for (int i = 0; i < setup.repetitions; ++i) {
    const absl::Time start = absl::Now();
    run();
    Synchronize(setup);
    seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  return Median(std::move(seconds));
}

// Fill: random weights of a trained model's scale, drawn on the device.
void Fill(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  for (at::Tensor& parameter : module.parameters()) parameter.normal_(0, 0.02);
}

class GpuBench {
 public:
  GpuBench(Setup setup, BenchReporter report)
      : setup_(std::move(setup)), report_(std::move(report)) {}

  void MeasureBlock() {
    TransformerBlock block(setup_.config, setup_.options);
    Fill(*block);
    const int64_t d = setup_.config.inner_dim();
    const at::Tensor image = at::randn({1, ImageTokens(setup_), d}, setup_.options);
    const at::Tensor text = at::randn({1, setup_.text_tokens, d}, setup_.options);
    const at::Tensor temb = at::randn({1, d}, setup_.options);
    const std::pair<at::Tensor, at::Tensor> freqs =  // {image, text}
        qwen_image::Rope(setup_.config.axes_dims_rope)
            .Frequencies({setup_.image, setup_.image}, setup_.text_tokens, setup_.options.device());
    auto forward = [&] {
      return block->forward(image, text, temb, freqs.first, freqs.second, {}, {});
    };
    const double flops = BlockForwardFlops(setup_);

    const double forward_s = MedianSeconds(setup_, [&] {
      torch::NoGradGuard no_grad;
      forward();
    });
    EmitSpeed("block_forward", forward_s, flops);
    const double training_s = MedianSeconds(setup_, [&] {
      const auto [text_out, image_out] = forward();
      (text_out.sum() + image_out.sum()).backward();
    });
    EmitSpeed("block_forward_backward", training_s, 3 * flops);
    if (kHasFusedAttention) {
      AttentionKernelScope blockwise(AttentionKernel::kBlockwise);
      const double blockwise_s = MedianSeconds(setup_, [&] {
        torch::NoGradGuard no_grad;
        forward();
      });
      Emit("block_forward_blockwise_ms", blockwise_s * 1e3, "ms");
      Emit("fused_attention_speedup", blockwise_s / forward_s, "x");
    }
  }

  // MeasureStep: the whole transformer, one denoising step with CFG,
  // where the device has room for its weights and a fifth more.
  absl::Status MeasureStep() {
    const int64_t weight_bytes =
        ParameterCount(*QwenImageTransformer(setup_.config, at::TensorOptions(at::kMeta))) *
        setup_.options.dtype().itemsize();
    if (setup_.device_memory > 0 && weight_bytes * 6 / 5 > setup_.device_memory) {
      Emit("step_skipped_weight_gib", weight_bytes / kGiB, "GiB");
      return absl::OkStatus();
    }
    QwenImageTransformer model(setup_.config, setup_.options);
    Fill(*model);
    const int64_t batch = 2;  // the prompt and the negative prompt
    const at::Tensor latents =
        at::randn({batch, ImageTokens(setup_), setup_.config.in_channels}, setup_.options);
    const at::Tensor text =
        at::randn({batch, setup_.text_tokens, setup_.config.joint_attention_dim}, setup_.options);
    const at::Tensor timestep = at::full({batch}, 0.5, setup_.options);
    const std::vector<SampleImages> images(batch, {setup_.image, setup_.image});
    absl::Status status;
    ResetPeakMemory();
    const double step_s = MedianSeconds(setup_, [&] {
      torch::NoGradGuard no_grad;
      status.Update(model->forward(latents, text, {}, timestep, images).status());
    });
    DRAY_RETURN_IF_ERROR(status);
    Emit("step_s", step_s, "s");
    Emit("step_peak_memory_gib", PeakMemoryBytes() / kGiB, "GiB");
    return absl::OkStatus();
  }

  std::vector<BenchMetric> metrics() && { return std::move(metrics_); }

 private:
  static constexpr double kGiB = 1 << 30;

  // The peak memory: on a GPU the CUDA allocator's since ResetPeakMemory (a
  // CUDA build without a device has no allocator to ask), on the CPU the
  // process's resident peak over its whole life.
  void ResetPeakMemory() const {
    if (setup_.options.device().is_cuda()) ResetCudaPeakAllocated(0);
  }

  double PeakMemoryBytes() const {
    if (setup_.options.device().is_cuda()) return CudaPeakAllocatedBytes(0);
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_maxrss * 1024.0;  // kilobytes on Linux
  }

  void EmitSpeed(const std::string& name, double seconds, double flops) {
    const double tflops = flops / seconds / 1e12;
    Emit(name + "_ms", seconds * 1e3, "ms");
    Emit(name + "_tflops", tflops, "TFLOP/s");
    if (setup_.peak_tflops > 0) Emit(name + "_peak_share", tflops / setup_.peak_tflops, "of peak");
  }

  void Emit(std::string name, double value, std::string unit) {
    metrics_.push_back({std::move(name), value, std::move(unit)});
    if (report_) report_(metrics_.back());
  }

  Setup setup_;
  BenchReporter report_;
  std::vector<BenchMetric> metrics_;
};

}  // namespace

absl::StatusOr<std::vector<BenchMetric>> RunGpuBench(const GpuBenchOptions& options) {
  GpuBench bench(SetupFor(DescribeCudaDevices(), options.quick), options.report);
  try {
    bench.MeasureBlock();
    DRAY_RETURN_IF_ERROR(bench.MeasureStep());
  } catch (const std::exception& e) {  // c10::Error: out of device memory, a CUDA error
    return absl::InternalError(absl::StrCat("the gpu suite failed: ", ExceptionMessage(e)));
  }
  return std::move(bench).metrics();
}

}  // namespace dray
