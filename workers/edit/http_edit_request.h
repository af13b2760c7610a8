// HttpEditRequest: one `POST /v1/images/edits` of dray serve's HTTP port
// (HttpGateway), read from OpenAI's multipart form or from the same fields
// as a JSON object, and checked before it goes on to the ImageEditService.
//
// OpenAI's fields: `image` or `image[]` (pictures 1 to 3, PNG or JPEG; in
// JSON base64 strings, bare or as data: URLs, one or a list), `prompt`
// (required), `n` (1 to 10 images, seeds seed, seed+1, ...), `size` ("WxH"
// or "auto"), `response_format` (only "b64_json": no image is stored to be
// fetched by URL), `output_format` (only "png"), `model` (checked by the
// gateway), `stream` (server-sent events; n = 1) and `user` (ignored).
// dray's own: `steps` (or `num_inference_steps`), `seed` (unset: a random
// one, returned with each image), `true_cfg_scale`, `guidance_scale`
// (FLUX.1 Kontext), `negative_prompt`,
// `timeout` (seconds, default 600). Any other field, `mask` included, is
// INVALID_ARGUMENT naming it (FieldOf).
//
//   absl::StatusOr<HttpEditRequest> request = ParseEditJson(body);
//   if (!request.ok()) reply 400 naming FieldOf(request.status())  (http_server.h)
#ifndef DRAY_WORKERS_EDIT_HTTP_EDIT_REQUEST_H_
#define DRAY_WORKERS_EDIT_HTTP_EDIT_REQUEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "dray/v1/image_edit.pb.h"
#include "runtime/http/http_server.h"

namespace dray {

// kMaxImagesPerRequest: the most images (`n`) one HTTP request asks for, as OpenAI's.
inline constexpr int kMaxImagesPerRequest = 10;

struct HttpEditRequest {
  v1::EditImageBatchRequest batch;  // n rows, seeds seed + i
  std::string model;                // as asked; empty: whichever is served
  bool stream = false;
  absl::Duration timeout = absl::Minutes(10);
};

// ParseEditForm reads OpenAI's multipart form.
absl::StatusOr<HttpEditRequest> ParseEditForm(std::vector<FormPart> parts);

// ParseEditJson reads the same fields from a JSON object.
absl::StatusOr<HttpEditRequest> ParseEditJson(absl::string_view body);

}  // namespace dray

#endif  // DRAY_WORKERS_EDIT_HTTP_EDIT_REQUEST_H_
