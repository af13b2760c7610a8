// Reading diffusers / transformers config.json files strictly: each field is
// read into a typed variable that keeps its default when the key is absent;
// a wrong type, an unknown key (listing the known ones) or a switched-on
// option dray does not implement is an error naming the file and key.
//
//   DRAY_ASSIGN_OR_RETURN(JsonConfig json, JsonConfig::ReadFile(path));
//   DRAY_RETURN_IF_ERROR(json.Get("num_layers", &config.num_layers));
//   DRAY_RETURN_IF_ERROR(json.Unsupported("guidance_embeds"));
//   DRAY_RETURN_IF_ERROR(json.Finish());
//
// Keys starting with "_" (_class_name, _diffusers_version) are ignored.
//
// Thread-safety: not thread-safe.
#ifndef DRAY_WORKERS_MODELS_JSON_CONFIG_H_
#define DRAY_WORKERS_MODELS_JSON_CONFIG_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dray {

// kDiffusersVersion: the diffusers version dray writes into the configs it
// creates (the layout it writes is that version's).
inline constexpr char kDiffusersVersion[] = "0.36.0";

class JsonConfig {
 public:
  // Parse reads `text`; `name` (a path) prefixes every error.
  static absl::StatusOr<JsonConfig> Parse(absl::string_view text, std::string name);
  static absl::StatusOr<JsonConfig> ReadFile(const std::string& path);

  absl::Status Get(const char* key, int64_t* value);
  absl::Status Get(const char* key, double* value);
  absl::Status Get(const char* key, bool* value);
  absl::Status Get(const char* key, std::string* value);
  absl::Status Get(const char* key, std::vector<int64_t>* value);
  absl::Status Get(const char* key, std::vector<double>* value);
  absl::Status Get(const char* key, std::vector<std::string>* value);
  absl::Status Get(const char* key, std::vector<bool>* value);
  // Get into an optional: JSON null or absence leaves it empty.
  absl::Status Get(const char* key, std::optional<double>* value);

  // Object returns the JSON object under `key` as a config of its own
  // (named "file: key"), empty when absent; unread keys there are its own
  // Finish's to report.
  absl::StatusOr<JsonConfig> Object(const char* key);

  // Ignore marks keys that carry no meaning for dray (bookkeeping such as
  // "architectures" or "torch_dtype"), so Finish accepts them (without
  // listing them among the known keys).
  void Ignore(std::initializer_list<const char*> keys);

  // IgnorePretrainedConfigKeys ignores the generic keys every transformers
  // PretrainedConfig writes out (generation settings, labels, dtype,
  // versions; transformers 4 and 5) but is_decoder, which a model must
  // read or ignore itself.
  void IgnorePretrainedConfigKeys();

  // Unsupported accepts `key` only when absent, false or null.
  absl::Status Unsupported(const char* key);

  // Finish reports keys that no Get or Unsupported asked for.
  absl::Status Finish() const;

 private:
  JsonConfig() = default;
  // Field returns the value of `key` (null when absent) and marks it known.
  const nlohmann::json& Field(const char* key);
  absl::Status WrongType(const char* key, const char* expected) const;

  std::string name_;
  std::shared_ptr<const nlohmann::json> json_;
  std::set<std::string> known_;  // asked for by Get, Object or Unsupported
  std::set<std::string> ignored_;
};

// ReadConfigFile reads `path` with Config::FromJson, every error naming
// the file.
template <typename Config>
absl::StatusOr<Config> ReadConfigFile(const std::string& path) {
  absl::StatusOr<JsonConfig> json = JsonConfig::ReadFile(path);
  if (!json.ok()) return json.status();
  absl::StatusOr<Config> config = Config::FromJson(*std::move(json));
  if (config.ok() || absl::StartsWith(config.status().message(), path)) return config;
  return absl::Status(config.status().code(), absl::StrCat(path, ": ", config.status().message()));
}

}  // namespace dray

#endif  // DRAY_WORKERS_MODELS_JSON_CONFIG_H_
