// What a training run draws for people to look at: line charts of its
// metrics and grids of sample images, as RGB tensors for EncodePng. Text is
// a built-in 5x7 bitmap font (digits, a few letters, ".-:+ ").
//
//   Series reward{"reward", {220, 60, 40}, steps, rewards};
//   at::Tensor chart = LineChart("reward", {reward}, 640, 240);
//   DRAY_RETURN_IF_ERROR(WritePngFile("curves.png", StackVertically({chart, loss_chart})));
//
// Thread-safety: pure functions.
#ifndef DRAY_WORKERS_TRAIN_PLOT_H_
#define DRAY_WORKERS_TRAIN_PLOT_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace dray {

using Rgb = std::array<uint8_t, 3>;

// Series: one line of a chart.
struct Series {
  std::string name;
  Rgb color;
  std::vector<double> x, y;
};

// LineChart draws `series` on shared axes under `title`, with the y range
// and the first and last x written on the axes, x named `x_label`.
// uint8 [height, width, 3].
at::Tensor LineChart(const std::string& title, const std::vector<Series>& series, int64_t width,
                     int64_t height, const std::string& x_label = "step");

// SampleRow: one row of a sample grid: the input pictures (captioned
// "input", or "picture N" when there are several), then outputs with captions.
struct SampleRow {
  std::vector<at::Tensor> inputs;     // uint8 [h, w, 3] each, picture 1 first
  std::vector<at::Tensor> outputs;    // uint8 [h', w', 3] each
  std::vector<std::string> captions;  // one per output (e.g. its reward)
};

// SampleGrid lays the rows out, each image scaled to `cell` pixels square
// (nearest neighbour), captions under the pictures (cut to their width).
at::Tensor SampleGrid(const std::vector<SampleRow>& rows, int64_t cell);

// StackVertically joins images of one width, top to bottom.
at::Tensor StackVertically(const std::vector<at::Tensor>& images);

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_PLOT_H_
