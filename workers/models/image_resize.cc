#include "workers/models/image_resize.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/shape_string.h"

namespace dray {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // Pillow's PRECISION_BITS for 8-bit images

double Bicubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
  return 0;
}

double Sinc(double x) {
  if (x == 0) return 1;
  x *= M_PI;
  return std::sin(x) / x;
}

double Lanczos(double x) { return (-3 < x && x < 3) ? Sinc(x) * Sinc(x / 3) : 0; }

// Taps: for each output index, the first input index and fixed-point weights.
struct Taps {
  std::vector<int> first;
  std::vector<std::vector<int32_t>> weights;
};

// ComputeTaps mirrors Pillow's precompute_coeffs and normalize_coeffs_8bpc.
Taps ComputeTaps(int in_size, int out_size, Resample resample) {
  const double support_unit = resample == Resample::kBicubic ? 2.0 : 3.0;
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = support_unit * filter_scale;
  Taps taps;
  for (int out = 0; out < out_size; ++out) {
    const double center = (out + 0.5) * scale;
    const int xmin = std::max(static_cast<int>(center - support + 0.5), 0);
    const int xmax = std::min(static_cast<int>(center + support + 0.5), in_size) - xmin;
    std::vector<double> w(xmax);
    double total = 0;
    for (int x = 0; x < xmax; ++x) {
      const double t = (x + xmin - center + 0.5) / filter_scale;
      w[x] = resample == Resample::kBicubic ? Bicubic(t) : Lanczos(t);
      total += w[x];
    }
    std::vector<int32_t> fixed(xmax);
    for (int x = 0; x < xmax; ++x) {
      const double k = (total != 0 ? w[x] / total : w[x]) * (1 << kPrecisionBits);
      fixed[x] = static_cast<int32_t>(k < 0 ? -0.5 + k : 0.5 + k);
    }
    taps.first.push_back(xmin);
    taps.weights.push_back(std::move(fixed));
  }
  return taps;
}

uint8_t Clip8(int64_t value) {
  value >>= kPrecisionBits;
  return static_cast<uint8_t>(std::clamp<int64_t>(value, 0, 255));
}

// ResizeAxis resamples `in` ([rows, in_size, channels] in memory, uint8)
// along its middle axis.
std::vector<uint8_t> ResizeAxis(const std::vector<uint8_t>& in, int rows, int in_size, int out_size,
                                int channels, Resample resample) {
  const Taps taps = ComputeTaps(in_size, out_size, resample);
  std::vector<uint8_t> out(static_cast<size_t>(rows) * out_size * channels);
  for (int r = 0; r < rows; ++r) {
    for (int o = 0; o < out_size; ++o) {
      const std::vector<int32_t>& weights = taps.weights[o];
      for (int c = 0; c < channels; ++c) {
        int64_t sum = int64_t{1} << (kPrecisionBits - 1);
        for (size_t k = 0; k < weights.size(); ++k) {
          sum += static_cast<int64_t>(
                     in[(static_cast<size_t>(r) * in_size + taps.first[o] + k) * channels + c]) *
                 weights[k];
        }
        out[(static_cast<size_t>(r) * out_size + o) * channels + c] = Clip8(sum);
      }
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<at::Tensor> ResizeImage(const at::Tensor& image, int64_t height, int64_t width,
                                       Resample resample) {
  if (image.dim() != 3 || image.scalar_type() != at::kByte || image.size(0) < 1 ||
      image.size(1) < 1) {
    return absl::InvalidArgumentError(absl::StrCat("resize: image must be uint8 [H, W, C], got ",
                                                   c10::toString(image.scalar_type()), " ",
                                                   ShapeString(image.sizes())));
  }
  if (height < 1 || width < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("resize: target size ", width, "x", height, " must be positive"));
  }
  const int h = static_cast<int>(image.size(0)), w = static_cast<int>(image.size(1)),
            c = static_cast<int>(image.size(2));
  const at::Tensor contiguous = image.cpu().contiguous();
  std::vector<uint8_t> pixels(contiguous.data_ptr<uint8_t>(),
                              contiguous.data_ptr<uint8_t>() + contiguous.numel());
  if (width != w) pixels = ResizeAxis(pixels, h, w, static_cast<int>(width), c, resample);
  if (height != h) {
    // The vertical pass: treat columns as rows by transposing through a tensor.
    at::Tensor rows =
        at::from_blob(pixels.data(), {h, width, c}, at::kByte).transpose(0, 1).contiguous();
    std::vector<uint8_t> transposed(rows.data_ptr<uint8_t>(),
                                    rows.data_ptr<uint8_t>() + rows.numel());
    transposed =
        ResizeAxis(transposed, static_cast<int>(width), h, static_cast<int>(height), c, resample);
    return at::from_blob(transposed.data(), {width, height, c}, at::kByte)
        .transpose(0, 1)
        .contiguous();
  }
  return at::from_blob(pixels.data(), {height, width, c}, at::kByte).clone();
}

}  // namespace dray
