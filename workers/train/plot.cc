#include "workers/train/plot.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

namespace dray {
namespace {

constexpr Rgb kBackground = {255, 255, 255};
constexpr Rgb kInk = {40, 40, 40};
constexpr Rgb kGrid = {225, 225, 225};

// Glyphs: 7 rows of 5 bits, the leftmost pixel in bit 4.
const std::map<char, std::array<uint8_t, 7>>& Font() {
  static const auto* font = new std::map<char, std::array<uint8_t, 7>>{
      {'0', {14, 17, 19, 21, 25, 17, 14}}, {'1', {4, 12, 4, 4, 4, 4, 14}},
      {'2', {14, 17, 1, 2, 4, 8, 31}},     {'3', {31, 2, 4, 2, 1, 17, 14}},
      {'4', {2, 6, 10, 18, 31, 2, 2}},     {'5', {31, 16, 30, 1, 1, 17, 14}},
      {'6', {6, 8, 16, 30, 17, 17, 14}},   {'7', {31, 1, 2, 4, 8, 8, 8}},
      {'8', {14, 17, 17, 14, 17, 17, 14}}, {'9', {14, 17, 17, 15, 1, 2, 12}},
      {'.', {0, 0, 0, 0, 0, 12, 12}},      {'-', {0, 0, 0, 31, 0, 0, 0}},
      {'+', {0, 4, 4, 31, 4, 4, 0}},       {':', {0, 12, 12, 0, 12, 12, 0}},
      {' ', {0, 0, 0, 0, 0, 0, 0}},        {'a', {0, 0, 14, 1, 15, 17, 15}},
      {'c', {0, 0, 14, 16, 16, 17, 14}},   {'d', {1, 1, 13, 19, 17, 17, 15}},
      {'e', {0, 0, 14, 17, 31, 16, 14}},   {'f', {6, 9, 8, 28, 8, 8, 8}},
      {'g', {0, 15, 17, 17, 15, 1, 14}},   {'i', {4, 0, 12, 4, 4, 4, 14}},
      {'k', {16, 16, 18, 20, 24, 20, 18}}, {'l', {12, 4, 4, 4, 4, 4, 14}},
      {'m', {0, 0, 26, 21, 21, 17, 17}},   {'n', {0, 0, 22, 25, 17, 17, 17}},
      {'o', {0, 0, 14, 17, 17, 17, 14}},   {'p', {0, 0, 30, 17, 30, 16, 16}},
      {'r', {0, 0, 22, 25, 16, 16, 16}},   {'s', {0, 0, 14, 16, 14, 1, 30}},
      {'t', {8, 8, 28, 8, 8, 9, 6}},       {'u', {0, 0, 17, 17, 17, 19, 13}},
      {'w', {0, 0, 17, 17, 21, 21, 10}},   {'_', {0, 0, 0, 0, 0, 0, 31}},
      {'x', {0, 0, 17, 10, 4, 10, 17}},    {'y', {0, 0, 17, 17, 15, 1, 14}},
      {'b', {16, 16, 22, 25, 17, 17, 30}}, {'h', {16, 16, 22, 25, 17, 17, 17}},
      {'j', {2, 0, 6, 2, 2, 18, 12}},      {'q', {0, 0, 13, 19, 15, 1, 1}},
      {'v', {0, 0, 17, 17, 17, 10, 4}},    {'z', {0, 0, 31, 2, 4, 8, 31}},
      {'(', {2, 4, 8, 8, 8, 4, 2}},        {')', {8, 4, 2, 2, 2, 4, 8}},
      {'/', {0, 1, 2, 4, 8, 16, 0}},
  };
  return *font;
}

// Canvas: an RGB image being drawn on.
class Canvas {
 public:
  Canvas(int64_t width, int64_t height)
      : pixels_(at::full({height, width, 3}, kBackground[0], at::kByte)),
        data_(pixels_.data_ptr<uint8_t>()),
        width_(width),
        height_(height) {}

  void Dot(int64_t x, int64_t y, Rgb color) {
    if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
    uint8_t* pixel = data_ + (y * width_ + x) * 3;
    std::copy(color.begin(), color.end(), pixel);
  }

  void Line(double x0, double y0, double x1, double y1, Rgb color) {
    const int64_t steps = static_cast<int64_t>(std::max(std::abs(x1 - x0), std::abs(y1 - y0))) + 1;
    for (int64_t i = 0; i <= steps; ++i) {
      const double t = static_cast<double>(i) / static_cast<double>(steps);
      Dot(std::lround(x0 + t * (x1 - x0)), std::lround(y0 + t * (y1 - y0)), color);
    }
  }

  // Text writes `text` with its top-left corner at (x, y), `scale` pixels a dot.
  void Text(int64_t x, int64_t y, const std::string& text, Rgb color, int scale = 1) {
    for (char c : text) {
      auto glyph = Font().find(c);
      if (glyph != Font().end()) {
        for (int row = 0; row < 7; ++row) {
          for (int col = 0; col < 5; ++col) {
            if (!(glyph->second[row] & (16 >> col))) continue;
            for (int dy = 0; dy < scale; ++dy)
              for (int dx = 0; dx < scale; ++dx)
                Dot(x + col * scale + dx, y + row * scale + dy, color);
          }
        }
      }
      x += 6 * scale;
    }
  }

  void Paste(const at::Tensor& image, int64_t x, int64_t y) {
    pixels_.narrow(0, y, image.size(0)).narrow(1, x, image.size(1)).copy_(image);
  }

  at::Tensor pixels() const { return pixels_; }

 private:
  at::Tensor pixels_;
  uint8_t* data_;
  int64_t width_, height_;
};

std::string Number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.4g", value);
  return text;
}

// Resized scales an image to cell x cell by nearest neighbour.
at::Tensor Resized(const at::Tensor& image, int64_t cell) {
  const at::Tensor rows = (at::arange(cell, at::kLong) * image.size(0)).div(cell, "floor");
  const at::Tensor cols = (at::arange(cell, at::kLong) * image.size(1)).div(cell, "floor");
  return image.index_select(0, rows).index_select(1, cols);
}

}  // namespace

at::Tensor LineChart(const std::string& title, const std::vector<Series>& series, int64_t width,
                     int64_t height, const std::string& x_label) {
  Canvas canvas(width, height);
  const int64_t left = 70, right = width - 20, top = 30, bottom = height - 30;
  double x_min = INFINITY, x_max = -INFINITY, y_min = INFINITY, y_max = -INFINITY;
  for (const Series& s : series) {
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.y[i])) continue;
      x_min = std::min(x_min, s.x[i]), x_max = std::max(x_max, s.x[i]);
      y_min = std::min(y_min, s.y[i]), y_max = std::max(y_max, s.y[i]);
    }
  }
  canvas.Text(left, 8, title, kInk, 2);
  if (!std::isfinite(x_min)) return canvas.pixels();  // nothing to draw yet
  if (x_max == x_min) x_max = x_min + 1;
  if (y_max == y_min) y_max = y_min + 1;
  const double pad = (y_max - y_min) * 0.05;
  y_min -= pad, y_max += pad;
  auto px = [&](double x) { return left + (x - x_min) / (x_max - x_min) * (right - left); };
  auto py = [&](double y) { return bottom - (y - y_min) / (y_max - y_min) * (bottom - top); };
  for (int i = 0; i <= 4; ++i) {
    const double y = y_min + (y_max - y_min) * i / 4.0;
    canvas.Line(left, py(y), right, py(y), kGrid);
    canvas.Text(4, static_cast<int64_t>(py(y)) - 3, Number(y), kInk);
  }
  canvas.Line(left, top, left, bottom, kInk);
  canvas.Line(left, bottom, right, bottom, kInk);
  canvas.Text(left, bottom + 8, Number(x_min), kInk);
  canvas.Text(right - 6 * static_cast<int64_t>(Number(x_max).size()), bottom + 8, Number(x_max),
              kInk);
  canvas.Text((left + right) / 2 - 3 * static_cast<int64_t>(x_label.size()), bottom + 8, x_label,
              kInk);
  // The legend beside the title, on a second line where the first is full.
  const int64_t legend_start = left + 6 * static_cast<int64_t>(title.size()) * 2 + 24;
  int64_t legend = legend_start, legend_y = 15;
  for (const Series& s : series) {
    for (size_t i = 1; i < s.x.size(); ++i) {
      if (std::isfinite(s.y[i - 1]) && std::isfinite(s.y[i]))
        canvas.Line(px(s.x[i - 1]), py(s.y[i - 1]), px(s.x[i]), py(s.y[i]), s.color);
    }
    const int64_t item = 20 + 6 * static_cast<int64_t>(s.name.size());
    if (legend + item > right && legend > legend_start) {
      legend = legend_start;
      legend_y += 10;
    }
    canvas.Line(legend, legend_y, legend + 16, legend_y, s.color);
    canvas.Text(legend + 20, legend_y - 3, s.name, kInk);
    legend += item + 16;
  }
  return canvas.pixels();
}

at::Tensor SampleGrid(const std::vector<SampleRow>& rows, int64_t cell) {
  size_t columns = 0;
  for (const SampleRow& row : rows)
    columns = std::max(columns, row.inputs.size() + row.outputs.size());
  const int64_t gap = 6, caption = 12;
  const int64_t row_height = cell + caption + gap;
  Canvas canvas(gap + static_cast<int64_t>(columns) * (cell + gap),
                gap + static_cast<int64_t>(rows.size()) * row_height);
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t y = gap + static_cast<int64_t>(r) * row_height;
    const std::vector<at::Tensor>& inputs = rows[r].inputs;
    auto x_of = [&](size_t column) { return gap + static_cast<int64_t>(column) * (cell + gap); };
    // Each caption under its picture, cut to the picture's width (6 pixels a letter).
    auto caption_at = [&](size_t column, const std::string& text) {
      canvas.Text(x_of(column), y + cell + 3, text.substr(0, (cell + gap / 2) / 6), kInk);
    };
    for (size_t c = 0; c < inputs.size(); ++c) {
      canvas.Paste(Resized(inputs[c], cell), x_of(c), y);
      caption_at(c, inputs.size() == 1 ? std::string("input") : "picture " + std::to_string(c + 1));
    }
    for (size_t c = 0; c < rows[r].outputs.size(); ++c) {
      canvas.Paste(Resized(rows[r].outputs[c], cell), x_of(inputs.size() + c), y);
      if (c < rows[r].captions.size()) caption_at(inputs.size() + c, rows[r].captions[c]);
    }
  }
  return canvas.pixels();
}

at::Tensor StackVertically(const std::vector<at::Tensor>& images) { return at::cat(images, 0); }

}  // namespace dray
