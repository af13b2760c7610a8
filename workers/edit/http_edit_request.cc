#include "workers/edit/http_edit_request.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <set>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/random/random.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "workers/pipeline/edit_batch.h"

namespace dray {
namespace {

absl::StatusOr<int64_t> IntField(absl::string_view field, absl::string_view value, int64_t low,
                                 int64_t high) {
  int64_t number;
  if (!absl::SimpleAtoi(value, &number) || number < low || number > high) {
    return FieldError(field,
                      absl::StrCat("'", value, "' is not a whole number from ", low, " to ", high));
  }
  return number;
}

absl::StatusOr<double> PositiveField(absl::string_view field, absl::string_view value) {
  double number;
  if (!absl::SimpleAtod(value, &number) || !(number > 0) || number > 1e6) {
    return FieldError(field, absl::StrCat("'", value, "' is not a positive number"));
  }
  return number;
}

absl::StatusOr<bool> BoolField(absl::string_view field, absl::string_view value) {
  bool on;
  if (!absl::SimpleAtob(value, &on)) {
    return FieldError(field, absl::StrCat("'", value, "' is neither true nor false"));
  }
  return on;
}

absl::Status SetSize(absl::string_view value, v1::EditImageRequest& row) {
  if (value == "auto") return absl::OkStatus();
  const std::vector<absl::string_view> sides = absl::StrSplit(value, 'x');
  int32_t width, height;
  if (sides.size() != 2 || !absl::SimpleAtoi(sides[0], &width) ||
      !absl::SimpleAtoi(sides[1], &height) || width <= 0 || height <= 0) {
    return FieldError(
        "size", absl::StrCat("'", value, "' is neither WIDTHxHEIGHT (each at least 1) nor auto"));
  }
  row.set_width(width);
  row.set_height(height);
  return absl::OkStatus();
}

// kFields: what ApplyField reads (the images apart).
constexpr absl::string_view kFields[] = {"prompt",
                                         "n",
                                         "size",
                                         "response_format",
                                         "output_format",
                                         "model",
                                         "stream",
                                         "partial_images",
                                         "user",
                                         "steps",
                                         "num_inference_steps",
                                         "seed",
                                         "true_cfg_scale",
                                         "guidance_scale",
                                         "negative_prompt",
                                         "timeout",
                                         "mask"};

absl::Status UnknownField(absl::string_view name) {
  return FieldError(name,
                    "unknown field (dray reads image, prompt, n, size, response_format, "
                    "output_format, model, stream, partial_images, user, steps, seed, "
                    "true_cfg_scale, guidance_scale, negative_prompt, timeout)");
}

// Parsed: the fields read so far.
struct Parsed {
  HttpEditRequest request;
  v1::EditImageRequest row;  // what every row shares
  std::vector<std::string> images;
  int64_t n = 1;
  std::optional<int64_t> seed;
};

// ApplyField reads one field other than the images.
absl::Status ApplyField(const std::string& name, const std::string& value, Parsed& parsed) {
  v1::EditImageRequest& row = parsed.row;
  if (name == "prompt") {
    row.set_instruction(value);
  } else if (name == "n") {
    DRAY_ASSIGN_OR_RETURN(parsed.n, IntField(name, value, 1, kMaxImagesPerRequest));
  } else if (name == "size") {
    return SetSize(value, row);
  } else if (name == "response_format") {
    if (value != "b64_json") {
      return FieldError(name, absl::StrCat("'", value,
                                           "' is not offered: dray returns images in the "
                                           "response, as b64_json"));
    }
  } else if (name == "output_format") {
    if (value != "png") return FieldError(name, absl::StrCat("'", value, "': dray writes png"));
  } else if (name == "model") {
    parsed.request.model = value;
  } else if (name == "stream") {
    DRAY_ASSIGN_OR_RETURN(parsed.request.stream, BoolField(name, value));
  } else if (name == "user") {
    // OpenAI's end-user id for abuse monitoring: nothing to do with it here.
  } else if (name == "partial_images") {
    if (value != "0") {
      return FieldError(name, absl::StrCat("'", value,
                                           "': dray streams each step's progress, not partial "
                                           "images; send 0 or leave it out"));
    }
  } else if (name == "steps" || name == "num_inference_steps") {
    DRAY_ASSIGN_OR_RETURN(const int64_t steps, IntField(name, value, 1, 1000));
    row.set_num_inference_steps(static_cast<int32_t>(steps));
  } else if (name == "seed") {
    DRAY_ASSIGN_OR_RETURN(parsed.seed, IntField(name, value, 0, int64_t{1} << 53));
  } else if (name == "true_cfg_scale") {
    DRAY_ASSIGN_OR_RETURN(const double scale, PositiveField(name, value));
    row.set_true_cfg_scale(scale);
  } else if (name == "guidance_scale") {
    DRAY_ASSIGN_OR_RETURN(const double scale, PositiveField(name, value));
    row.set_guidance_scale(scale);
  } else if (name == "negative_prompt") {
    row.set_negative_prompt(value);
  } else if (name == "timeout") {
    DRAY_ASSIGN_OR_RETURN(const double seconds, PositiveField(name, value));
    parsed.request.timeout = absl::Seconds(seconds);
  } else if (name == "mask") {
    return FieldError(name, "masks are not supported: the model edits what the prompt says");
  } else {
    return UnknownField(name);
  }
  return absl::OkStatus();
}

absl::StatusOr<HttpEditRequest> Finish(Parsed parsed) {
  if (parsed.images.empty()) return FieldError("image", "required: a PNG or JPEG file");
  if (parsed.images.size() > static_cast<size_t>(kMaxPictures)) {
    return FieldError("image", absl::StrCat(parsed.images.size(), " images; at most ", kMaxPictures,
                                            " pictures per edit"));
  }
  if (parsed.row.instruction().empty()) return FieldError("prompt", "required: what to change");
  if (parsed.request.stream && parsed.n != 1) {
    return FieldError("n", "a stream carries one image: n must be 1");
  }
  if (!parsed.seed.has_value()) {
    thread_local absl::BitGen random;
    parsed.seed = absl::Uniform<int64_t>(random, 0, int64_t{1} << 31);
  }
  v1::EditImageRequest& row = parsed.row;
  row.set_image(parsed.images[0]);
  for (size_t i = 1; i < parsed.images.size(); ++i) row.add_more_images(parsed.images[i]);
  for (int64_t i = 0; i < parsed.n; ++i) {
    row.set_seed(*parsed.seed + i);
    *parsed.request.batch.add_requests() = row;
  }
  return std::move(parsed.request);
}

bool IsImageField(absl::string_view name) { return name == "image" || name == "image[]"; }

// ReadFields applies every field, each non-image one at most once.
absl::StatusOr<HttpEditRequest> ReadFields(std::vector<FormPart> parts) {
  Parsed parsed;
  std::set<std::string> seen;
  for (FormPart& part : parts) {
    if (part.name.empty()) {
      return absl::InvalidArgumentError("a form part has no name: name each (image, prompt, ...)");
    }
    if (IsImageField(part.name)) {
      parsed.images.push_back(std::move(part.content));
      continue;
    }
    if (!seen.insert(part.name).second) return FieldError(part.name, "given more than once");
    DRAY_RETURN_IF_ERROR(ApplyField(part.name, part.content, parsed));
  }
  return Finish(std::move(parsed));
}

// DecodeImage reads a JSON image: base64, bare or as a data: URL.
absl::StatusOr<std::string> DecodeImage(const nlohmann::json& value, size_t index) {
  if (!value.is_string()) {
    return FieldError("image", absl::StrCat("image ", index + 1, " is not a base64 string"));
  }
  absl::string_view text = value.get_ref<const std::string&>();
  if (absl::ConsumePrefix(&text, "data:")) {
    const size_t comma = text.find(',');
    if (comma == absl::string_view::npos || !absl::EndsWith(text.substr(0, comma), ";base64")) {
      return FieldError("image",
                        absl::StrCat("image ", index + 1, " is a data: URL without base64"));
    }
    text.remove_prefix(comma + 1);
  }
  std::string bytes;
  if (!absl::Base64Unescape(text, &bytes)) {
    return FieldError("image", absl::StrCat("image ", index + 1, " is not valid base64"));
  }
  return bytes;
}

}  // namespace

absl::StatusOr<HttpEditRequest> ParseEditForm(std::vector<FormPart> parts) {
  return ReadFields(std::move(parts));
}

absl::StatusOr<HttpEditRequest> ParseEditJson(absl::string_view body) {
  const nlohmann::json json = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        "the body is not a JSON object (send the fields as one, or as multipart/form-data)");
  }
  std::vector<FormPart> parts;
  for (const auto& [name, value] : json.items()) {
    if (value.is_null()) continue;
    if (IsImageField(name)) {
      const nlohmann::json images = value.is_array() ? value : nlohmann::json::array({value});
      for (size_t i = 0; i < images.size(); ++i) {
        DRAY_ASSIGN_OR_RETURN(std::string bytes, DecodeImage(images[i], i));
        parts.push_back({"image", std::move(bytes)});
      }
    } else if (value.is_string()) {
      parts.push_back({name, value.get<std::string>()});
    } else if (value.is_number() || value.is_boolean()) {
      parts.push_back({name, value.dump()});
    } else if (!absl::c_linear_search(kFields, name)) {
      return UnknownField(name);
    } else {
      return FieldError(name, "must be a string, a number or a boolean");
    }
  }
  return ReadFields(std::move(parts));
}

}  // namespace dray
