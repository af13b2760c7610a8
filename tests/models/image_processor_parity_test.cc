// Qwen2VLImageProcessor parity: dray's smart_resize, Pillow-exact resize and
// patch layout against transformers' own outputs in
// tests/data/reference/qwen2_vl/image_processor (see its README): sizes,
// resized pixels and grids exactly, pixel values within 1e-6.
#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "runtime/io/safetensors.h"
#include "tests/models/reference.h"
#include "workers/models/image_resize.h"
#include "workers/models/qwen2_vl/image_processor.h"

namespace dray::qwen2_vl {
namespace {

std::string ProcessorPath(const std::string& file) {
  return absl::StrCat(ReferenceDir("qwen2_vl"), "/image_processor/", file);
}

TEST(ImageProcessorParityTest, SmartResizeMatchesEveryRowOfTheTable) {
  auto file = SafetensorsFile::Open(ProcessorPath("case_smart_resize_table.safetensors")).value();
  const at::Tensor table = file->Get("h_w_min_max_outh_outw").value();
  ASSERT_GT(table.size(0), 0);
  for (int64_t i = 0; i < table.size(0); ++i) {
    const auto row = table[i].contiguous();
    const int64_t* v = row.data_ptr<int64_t>();
    ImageProcessorConfig config;
    config.min_pixels = v[2];
    config.max_pixels = v[3];
    const auto resized = SmartResize(v[0], v[1], config);
    if (v[4] < 0) {
      EXPECT_FALSE(resized.ok()) << "row " << i << ": " << v[0] << "x" << v[1];
      continue;
    }
    ASSERT_TRUE(resized.ok()) << "row " << i << ": " << resized.status();
    EXPECT_EQ(resized->first, v[4]) << "row " << i;
    EXPECT_EQ(resized->second, v[5]) << "row " << i;
  }
}

class ImageProcessorCaseTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ImageProcessorCaseTest, MatchesTransformers) {
  auto file = SafetensorsFile::Open(ProcessorPath(GetParam() + ".safetensors")).value();
  DRAY_ASSERT_OK_AND_ASSIGN(
      ImageProcessorConfig config,
      ImageProcessorConfig::FromFile(ProcessorPath("preprocessor_config.json")));
  const nlohmann::json kwargs = nlohmann::json::parse(file->metadata().at("processor_kwargs"));
  if (kwargs.contains("min_pixels")) config.min_pixels = kwargs["min_pixels"].get<int64_t>();
  if (kwargs.contains("max_pixels")) config.max_pixels = kwargs["max_pixels"].get<int64_t>();
  const at::Tensor grids = file->Get("image_grid_thw").value();
  const at::Tensor pixel_values = file->Get("pixel_values").value();
  int64_t row = 0;
  for (int64_t j = 0; file->contains(absl::StrCat("image", j, "_uint8_hwc")); ++j) {
    SCOPED_TRACE(absl::StrCat("image ", j));
    const at::Tensor image = file->Get(absl::StrCat("image", j, "_uint8_hwc")).value();
    const at::Tensor expected = file->Get(absl::StrCat("image", j, "_resized_uint8_hwc")).value();
    // The resize alone: Pillow's bicubic, bit for bit.
    DRAY_ASSERT_OK_AND_ASSIGN(
        at::Tensor resized,
        ResizeImage(image, expected.size(0), expected.size(1), Resample::kBicubic));
    EXPECT_TRUE(at::equal(resized, expected));
    // The whole processor.
    DRAY_ASSERT_OK_AND_ASSIGN(ProcessedImage processed, ProcessImage(image, config));
    for (int axis = 0; axis < 3; ++axis) {
      EXPECT_EQ(processed.grid[axis], grids[j][axis].item<int64_t>()) << "axis " << axis;
    }
    const int64_t rows = processed.patches.size(0);
    ASSERT_LE(row + rows, pixel_values.size(0));
    const double max_abs =
        (processed.patches - pixel_values.narrow(0, row, rows)).abs().max().item<double>();
    EXPECT_LE(max_abs, 1e-6);
    row += rows;
  }
  EXPECT_EQ(row, pixel_values.size(0));
}

INSTANTIATE_TEST_SUITE_P(Reference, ImageProcessorCaseTest,
                         ::testing::Values("case_default_odd_sizes", "case_default_exact_multiple",
                                           "case_max_pixels_downscale",
                                           "case_max_pixels_tiny_budget"));

}  // namespace
}  // namespace dray::qwen2_vl
