#include "workers/models/flux/kontext_helpers.h"

#include <ATen/ATen.h>

#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace dray::flux {
namespace {

// Floor: `value` rounded down to a multiple of `multiple`.
int64_t Floor(int64_t value, int64_t multiple) { return value / multiple * multiple; }

// PythonRound: Python's round() of a non-negative double (half to even).
int64_t PythonRound(double value) { return static_cast<int64_t>(std::nearbyint(value)); }

}  // namespace

const std::vector<std::pair<int64_t, int64_t>> kPreferredKontextResolutions = {
    {672, 1568}, {688, 1504}, {720, 1456},  {752, 1392}, {800, 1328}, {832, 1248},
    {880, 1184}, {944, 1104}, {1024, 1024}, {1104, 944}, {1184, 880}, {1248, 832},
    {1328, 800}, {1392, 752}, {1456, 720},  {1504, 688}, {1568, 672}};

absl::StatusOr<KontextSizes> ComputeKontextSizes(int64_t image_width, int64_t image_height,
                                                 const KontextOptions& options,
                                                 int64_t vae_scale_factor) {
  const int64_t multiple = 2 * vae_scale_factor;
  KontextSizes sizes;
  // The output: max_area at the requested aspect ratio (diffusers: 1024^2 by default).
  const double requested_width = static_cast<double>(options.width.value_or(1024));
  const double requested_height = static_cast<double>(options.height.value_or(1024));
  const double aspect = requested_width / requested_height;
  sizes.width = Floor(PythonRound(std::sqrt(options.max_area * aspect)), multiple);
  sizes.height = Floor(PythonRound(std::sqrt(options.max_area / aspect)), multiple);
  // The input: floored (the image processor's default size), then the
  // nearest preferred resolution, floored again.
  int64_t width = Floor(image_width, multiple), height = Floor(image_height, multiple);
  // As diffusers, the floored size's aspect ratio picks (a width of 0 the narrowest).
  if (options.auto_resize && height > 0) {
    const double image_aspect = static_cast<double>(width) / static_cast<double>(height);
    std::tuple<double, int64_t, int64_t> best{INFINITY, 0, 0};
    for (const auto& [w, h] : kPreferredKontextResolutions) {
      best = std::min(best, {std::abs(image_aspect - static_cast<double>(w) / h), w, h});
    }
    // The preferred sizes are about 1024^2 pixels: scaled to max_area.
    const double scale = std::sqrt(static_cast<double>(options.max_area)) / 1024;
    width = PythonRound(std::get<1>(best) * scale);
    height = PythonRound(std::get<2>(best) * scale);
  }
  sizes.image_width = Floor(width, multiple);
  sizes.image_height = Floor(height, multiple);
  if (sizes.width <= 0 || sizes.height <= 0 || sizes.image_width <= 0 || sizes.image_height <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("edit: the input (", image_width, "x", image_height, ") and the output (",
                     sizes.width, "x", sizes.height, ": about ", options.max_area,
                     " pixels at the aspect ratio ", requested_width, ":", requested_height,
                     ") must each be at least one latent token (", multiple, " pixels) a side"));
  }
  return sizes;
}

at::Tensor LatentImageIds(int64_t rows, int64_t columns, int64_t index) {
  const at::Tensor row = at::arange(rows, at::kFloat).view({rows, 1}).expand({rows, columns});
  const at::Tensor column =
      at::arange(columns, at::kFloat).view({1, columns}).expand({rows, columns});
  return at::stack({at::full({rows, columns}, static_cast<double>(index), at::kFloat), row, column},
                   -1)
      .reshape({rows * columns, 3});
}

}  // namespace dray::flux
