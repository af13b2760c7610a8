// Decoding PNG and JPEG files into RGB tensors and encoding PNG and JPEG, for what
// users send (image bytes) and what dray returns.
//
//   DRAY_ASSIGN_OR_RETURN(ImageHeader header, ProbeImage(bytes));  // size, no pixels
//   DRAY_ASSIGN_OR_RETURN(at::Tensor rgb, DecodeImage(bytes));  // uint8 [H, W, 3]
//   DRAY_ASSIGN_OR_RETURN(std::string png, EncodePng(rgb));
//
// Grayscale, palette, 16-bit and alpha images become 8-bit RGB (alpha is
// composited on black; PIL's convert("RGB") drops alpha instead, so pixels
// that are not opaque differ from diffusers' input). Corrupt or
// unsupported data is INVALID_ARGUMENT saying why; images larger than
// `max_pixels` are refused before any pixel memory is allocated.
#ifndef DRAY_WORKERS_IMAGE_IMAGE_CODEC_H_
#define DRAY_WORKERS_IMAGE_IMAGE_CODEC_H_

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dray {

// kDefaultMaxPixels: 64 megapixels.
inline constexpr int64_t kDefaultMaxPixels = int64_t{64} << 20;

// IsJpeg is true when `bytes` start with JPEG's signature.
bool IsJpeg(absl::string_view bytes);

// ImageHeader: what an image file's header says.
struct ImageHeader {
  enum class Format { kPng, kJpeg };
  Format format = Format::kPng;
  int64_t width = 0;
  int64_t height = 0;
};

// ProbeImage reads the header of PNG or JPEG bytes, no pixel: the format and
// size, refused (INVALID_ARGUMENT) beyond `max_pixels`. What the header
// promises, only DecodeImage can confirm.
absl::StatusOr<ImageHeader> ProbeImage(absl::string_view bytes,
                                       int64_t max_pixels = kDefaultMaxPixels);

// DecodeImage reads PNG or JPEG bytes (recognized by their signature).
absl::StatusOr<at::Tensor> DecodeImage(absl::string_view bytes,
                                       int64_t max_pixels = kDefaultMaxPixels);

// EncodePng writes an RGB image (uint8 [H, W, 3]) as PNG.
absl::StatusOr<std::string> EncodePng(const at::Tensor& rgb);

// EncodeJpeg writes an RGB image (uint8 [H, W, 3]) as JPEG at `quality`
// (1-100, libjpeg's scale).
absl::StatusOr<std::string> EncodeJpeg(const at::Tensor& rgb, int quality);

// ReadImageFile and WritePngFile: the same, through files.
absl::StatusOr<at::Tensor> ReadImageFile(const std::string& path);
absl::Status WritePngFile(const std::string& path, const at::Tensor& rgb);

}  // namespace dray

#endif  // DRAY_WORKERS_IMAGE_IMAGE_CODEC_H_
