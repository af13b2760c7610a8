// Image files and resizing: PNG and JPEG decoding, PNG round trips, clear
// errors for bad data, and Pillow-style resampling properties.
#include <ATen/ATen.h>

#include <csetjmp>
#include <cstdio>
#include <string>

#include <jpeglib.h>

#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "workers/image/image_codec.h"
#include "workers/models/image_resize.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::HasSubstr;

at::Tensor Gradient(int64_t height, int64_t width) {
  return at::arange(height * width * 3, at::kLong)
      .remainder(251)
      .to(at::kByte)
      .view({height, width, 3});
}

// EncodeJpeg writes `rgb` as a JPEG at quality 95 (tests only).
std::string EncodeJpeg(const at::Tensor& rgb) {
  jpeg_compress_struct info{};
  jpeg_error_mgr error{};
  info.err = jpeg_std_error(&error);
  jpeg_create_compress(&info);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&info, &buffer, &size);
  info.image_width = static_cast<JDIMENSION>(rgb.size(1));
  info.image_height = static_cast<JDIMENSION>(rgb.size(0));
  info.input_components = 3;
  info.in_color_space = JCS_RGB;
  jpeg_set_defaults(&info);
  jpeg_set_quality(&info, 95, TRUE);
  jpeg_start_compress(&info, TRUE);
  const at::Tensor pixels = rgb.contiguous();
  while (info.next_scanline < info.image_height) {
    JSAMPROW row =
        pixels.data_ptr<uint8_t>() + static_cast<size_t>(info.next_scanline) * info.image_width * 3;
    jpeg_write_scanlines(&info, &row, 1);
  }
  jpeg_finish_compress(&info);
  jpeg_destroy_compress(&info);
  std::string jpeg(reinterpret_cast<char*>(buffer), size);
  std::free(buffer);
  return jpeg;
}

TEST(ImageCodecTest, PngRoundTripsExactly) {
  const at::Tensor image = Gradient(17, 23);
  DRAY_ASSERT_OK_AND_ASSIGN(std::string png, EncodePng(image));
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor decoded, DecodeImage(png));
  EXPECT_TRUE(decoded.equal(image));
}

TEST(ImageCodecTest, JpegDecodesToRgbOfItsSize) {
  const at::Tensor image = at::full({24, 40, 3}, 200, at::kByte);
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor decoded, DecodeImage(EncodeJpeg(image)));
  EXPECT_EQ(decoded.sizes(), image.sizes());
  EXPECT_LE((decoded.to(at::kInt) - 200).abs().max().item<int>(),
            2);  // lossy, but a flat image stays flat
}

TEST(ImageCodecTest, BadDataIsInvalidArgument) {
  EXPECT_THAT(DecodeImage("hello"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("neither PNG nor JPEG")));
  DRAY_ASSERT_OK_AND_ASSIGN(std::string png, EncodePng(Gradient(8, 8)));
  EXPECT_THAT(DecodeImage(png.substr(0, png.size() / 2)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("PNG")));
  const std::string jpeg = EncodeJpeg(Gradient(16, 16));
  EXPECT_THAT(DecodeImage(jpeg.substr(0, 20)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("JPEG")));
  EXPECT_THAT(DecodeImage(png, /*max_pixels=*/10),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 10 pixels")));
  EXPECT_THAT(EncodePng(at::zeros({4, 4}, at::kByte)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ImageResizeTest, IdentityConstantAndShape) {
  const at::Tensor image = Gradient(30, 40);
  for (Resample resample : {Resample::kBicubic, Resample::kLanczos}) {
    EXPECT_TRUE(ResizeImage(image, 30, 40, resample)->equal(image));
    const at::Tensor flat = at::full({30, 40, 3}, 77, at::kByte);
    DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor resized, ResizeImage(flat, 13, 71, resample));
    EXPECT_EQ(resized.sizes(), (std::vector<int64_t>{13, 71, 3}));
    EXPECT_TRUE(resized.eq(77).all().item<bool>());  // weights sum to one: a flat image stays flat
  }
  EXPECT_THAT(ResizeImage(image, 0, 5, Resample::kBicubic),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ImageResizeTest, DownscalingMatchesPillowsFixedPointFilter) {
  // Halving a 1-pixel stripe pattern: Pillow widens the bicubic filter to
  // 4 taps per side (7 used), normalizes the weights in 22-bit fixed point
  // and rounds; worked out by hand with Pillow's formulas: 146 126 129 109.
  at::Tensor row = at::zeros({1, 8, 3}, at::kByte);
  row.slice(1, 0, 8, 2).fill_(255);
  DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor half, ResizeImage(row, 1, 4, Resample::kBicubic));
  EXPECT_TRUE(half.select(2, 0).equal(at::tensor({146, 126, 129, 109}, at::kByte).view({1, 4})))
      << half;
}

}  // namespace
}  // namespace dray
