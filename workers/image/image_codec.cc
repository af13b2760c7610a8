#include "workers/image/image_codec.h"

#include <ATen/ATen.h>

#include <csetjmp>
#include <cstdio>
#include <cstdlib>

#include <jpeglib.h>
#include <png.h>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/shape_string.h"
#include "base/status_macros.h"

namespace dray {
namespace {

absl::Status NeitherPngNorJpeg(absl::string_view bytes) {
  return absl::InvalidArgumentError(
      absl::StrCat("image data (", bytes.size(), " bytes) is neither PNG nor JPEG"));
}

absl::Status TooLarge(int64_t width, int64_t height, int64_t max_pixels) {
  return absl::InvalidArgumentError(absl::StrCat("image is ", width, "x", height, "; at most ",
                                                 max_pixels, " pixels are accepted"));
}

bool IsPng(absl::string_view bytes) {
  return bytes.size() >= 8 &&
         png_sig_cmp(reinterpret_cast<png_const_bytep>(bytes.data()), 0, 8) == 0;
}

// BeginPng reads a PNG's header into `image`, checking its size; on error
// nothing is left to free.
absl::Status BeginPng(absl::string_view bytes, int64_t max_pixels, png_image* image) {
  *image = png_image{};
  image->version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(image, bytes.data(), bytes.size())) {
    return absl::InvalidArgumentError(absl::StrCat("not a readable PNG: ", image->message));
  }
  if (static_cast<int64_t>(image->width) * image->height > max_pixels) {
    png_image_free(image);
    return TooLarge(image->width, image->height, max_pixels);
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> DecodePng(absl::string_view bytes, int64_t max_pixels) {
  png_image image;
  DRAY_RETURN_IF_ERROR(BeginPng(bytes, max_pixels, &image));
  image.format = PNG_FORMAT_RGB;
  png_color black{0, 0, 0};
  at::Tensor rgb = at::empty({image.height, image.width, 3}, at::kByte);
  if (!png_image_finish_read(&image, &black, rgb.data_ptr<uint8_t>(), 0, nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("corrupt PNG: ", image.message));
  }
  return rgb;
}

struct JpegError {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void OnJpegError(j_common_ptr info) {
  JpegError* error = reinterpret_cast<JpegError*>(info->err);
  (*info->err->format_message)(info, error->message);
  std::longjmp(error->jump, 1);
}

// DecodeJpeg keeps no C++ object with a destructor alive across libjpeg
// calls: libjpeg's errors longjmp back to setjmp, skipping destructors. The
// pixels live in a malloc'd buffer until decoding has finished.
absl::StatusOr<at::Tensor> DecodeJpeg(absl::string_view bytes, int64_t max_pixels) {
  jpeg_decompress_struct info{};
  JpegError error{};
  info.err = jpeg_std_error(&error.manager);
  error.manager.error_exit = OnJpegError;
  uint8_t* volatile pixels = nullptr;
  if (setjmp(error.jump)) {
    jpeg_destroy_decompress(&info);
    std::free(pixels);
    return absl::InvalidArgumentError(absl::StrCat("corrupt JPEG: ", error.message));
  }
  jpeg_create_decompress(&info);
  jpeg_mem_src(&info, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  jpeg_read_header(&info, TRUE);
  const int64_t width = info.image_width, height = info.image_height;
  if (width * height > max_pixels) {
    jpeg_destroy_decompress(&info);
    return TooLarge(width, height, max_pixels);
  }
  info.out_color_space = JCS_RGB;
  jpeg_start_decompress(&info);
  const size_t stride = static_cast<size_t>(info.output_width) * 3;
  pixels = static_cast<uint8_t*>(std::malloc(stride * info.output_height));
  if (pixels == nullptr) {
    jpeg_destroy_decompress(&info);
    return absl::ResourceExhaustedError(
        absl::StrCat("no memory for a ", width, "x", height, " image"));
  }
  while (info.output_scanline < info.output_height) {
    JSAMPROW row = pixels + info.output_scanline * stride;
    jpeg_read_scanlines(&info, &row, 1);
  }
  const int64_t out_height = info.output_height, out_width = info.output_width;
  jpeg_finish_decompress(&info);
  jpeg_destroy_decompress(&info);
  return at::from_blob(
      pixels, {out_height, out_width, 3}, [](void* data) { std::free(data); }, at::kByte);
}

// ProbeJpeg reads a JPEG's header only (see DecodeJpeg on longjmp).
absl::StatusOr<ImageHeader> ProbeJpeg(absl::string_view bytes) {
  jpeg_decompress_struct info{};
  JpegError error{};
  info.err = jpeg_std_error(&error.manager);
  error.manager.error_exit = OnJpegError;
  if (setjmp(error.jump)) {
    jpeg_destroy_decompress(&info);
    return absl::InvalidArgumentError(absl::StrCat("corrupt JPEG: ", error.message));
  }
  jpeg_create_decompress(&info);
  jpeg_mem_src(&info, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  jpeg_read_header(&info, TRUE);
  const int64_t width = info.image_width, height = info.image_height;
  jpeg_destroy_decompress(&info);
  return ImageHeader{ImageHeader::Format::kJpeg, width, height};
}

}  // namespace

absl::StatusOr<ImageHeader> ProbeImage(absl::string_view bytes, int64_t max_pixels) {
  if (IsPng(bytes)) {
    png_image image;
    DRAY_RETURN_IF_ERROR(BeginPng(bytes, max_pixels, &image));
    const ImageHeader header{ImageHeader::Format::kPng, image.width, image.height};
    png_image_free(&image);
    return header;
  }
  if (!IsJpeg(bytes)) return NeitherPngNorJpeg(bytes);
  DRAY_ASSIGN_OR_RETURN(ImageHeader header, ProbeJpeg(bytes));
  if (header.width * header.height > max_pixels) {
    return TooLarge(header.width, header.height, max_pixels);
  }
  return header;
}

bool IsJpeg(absl::string_view bytes) {
  return bytes.size() >= 3 && static_cast<unsigned char>(bytes[0]) == 0xFF &&
         static_cast<unsigned char>(bytes[1]) == 0xD8 &&
         static_cast<unsigned char>(bytes[2]) == 0xFF;
}

absl::StatusOr<at::Tensor> DecodeImage(absl::string_view bytes, int64_t max_pixels) {
  if (IsPng(bytes)) return DecodePng(bytes, max_pixels);
  if (IsJpeg(bytes)) return DecodeJpeg(bytes, max_pixels);
  return NeitherPngNorJpeg(bytes);
}

namespace {

// CheckEncodable: an encoder's input must be a non-empty uint8 [H, W, 3] image.
absl::Status CheckEncodable(const at::Tensor& rgb, absl::string_view format) {
  if (rgb.dim() != 3 || rgb.size(2) != 3 || rgb.scalar_type() != at::kByte || rgb.numel() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(format, " encoding needs a non-empty uint8 [H, W, 3] image, got ",
                     c10::toString(rgb.scalar_type()), " ", ShapeString(rgb.sizes())));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> EncodePng(const at::Tensor& rgb) {
  DRAY_RETURN_IF_ERROR(CheckEncodable(rgb, "PNG"));
  const at::Tensor pixels = rgb.contiguous();
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(pixels.size(1));
  image.height = static_cast<png_uint_32>(pixels.size(0));
  image.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&image, nullptr, &size, 0, pixels.data_ptr<uint8_t>(), 0,
                                 nullptr)) {
    return absl::InternalError(absl::StrCat("PNG encoding failed: ", image.message));
  }
  std::string png(size, '\0');
  if (!png_image_write_to_memory(&image, png.data(), &size, 0, pixels.data_ptr<uint8_t>(), 0,
                                 nullptr)) {
    return absl::InternalError(absl::StrCat("PNG encoding failed: ", image.message));
  }
  png.resize(size);
  return png;
}

absl::StatusOr<std::string> EncodeJpeg(const at::Tensor& rgb, int quality) {
  DRAY_RETURN_IF_ERROR(CheckEncodable(rgb, "JPEG"));
  const at::Tensor pixels = rgb.contiguous();
  // As in DecodeJpeg: nothing with a destructor lives across libjpeg calls.
  jpeg_compress_struct info{};
  JpegError error{};
  info.err = jpeg_std_error(&error.manager);
  error.manager.error_exit = OnJpegError;
  unsigned char* volatile buffer = nullptr;
  unsigned long size = 0;  // NOLINT(runtime/int): libjpeg's type
  if (setjmp(error.jump)) {
    jpeg_destroy_compress(&info);
    std::free(buffer);
    return absl::InternalError(absl::StrCat("JPEG encoding failed: ", error.message));
  }
  jpeg_create_compress(&info);
  unsigned char* out = nullptr;
  jpeg_mem_dest(&info, &out, &size);
  info.image_width = static_cast<JDIMENSION>(pixels.size(1));
  info.image_height = static_cast<JDIMENSION>(pixels.size(0));
  info.input_components = 3;
  info.in_color_space = JCS_RGB;
  jpeg_set_defaults(&info);
  jpeg_set_quality(&info, quality, TRUE);
  jpeg_start_compress(&info, TRUE);
  const size_t stride = static_cast<size_t>(info.image_width) * 3;
  const uint8_t* data = pixels.data_ptr<uint8_t>();
  while (info.next_scanline < info.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(data + info.next_scanline * stride);
    jpeg_write_scanlines(&info, &row, 1);
  }
  jpeg_finish_compress(&info);
  buffer = out;
  jpeg_destroy_compress(&info);
  std::string jpeg(reinterpret_cast<const char*>(buffer), size);
  std::free(buffer);
  return jpeg;
}

absl::StatusOr<at::Tensor> ReadImageFile(const std::string& path) {
  DRAY_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  absl::StatusOr<at::Tensor> image = DecodeImage(bytes);
  if (!image.ok())
    return absl::Status(image.status().code(), absl::StrCat(path, ": ", image.status().message()));
  return image;
}

absl::Status WritePngFile(const std::string& path, const at::Tensor& rgb) {
  DRAY_ASSIGN_OR_RETURN(std::string png, EncodePng(rgb));
  return WriteFile(path, png);
}

}  // namespace dray
