#include "workers/models/json_config.h"

#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/files.h"
#include "base/status_macros.h"

namespace dray {
namespace {

const nlohmann::json& Null() {
  static const nlohmann::json* null = new nlohmann::json(nullptr);
  return *null;
}

}  // namespace

absl::StatusOr<JsonConfig> JsonConfig::Parse(absl::string_view text, std::string name) {
  auto parsed = std::make_shared<nlohmann::json>(
      nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false));
  if (parsed->is_discarded() || !parsed->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(name, " is not a JSON object"));
  }
  JsonConfig config;
  config.name_ = std::move(name);
  config.json_ = std::move(parsed);
  return config;
}

absl::StatusOr<JsonConfig> JsonConfig::ReadFile(const std::string& path) {
  DRAY_ASSIGN_OR_RETURN(std::string text, ::dray::ReadFile(path));
  return Parse(text, path);
}

const nlohmann::json& JsonConfig::Field(const char* key) {
  known_.insert(key);
  auto it = json_->find(key);
  return it == json_->end() ? Null() : *it;
}

absl::Status JsonConfig::WrongType(const char* key, const char* expected) const {
  return absl::InvalidArgumentError(absl::StrCat(name_, ": '", key, "' must be ", expected));
}

absl::Status JsonConfig::Get(const char* key, int64_t* value) {
  const nlohmann::json& field = Field(key);
  if (field.is_null()) return absl::OkStatus();
  if (!field.is_number_integer()) return WrongType(key, "an integer");
  *value = field.get<int64_t>();
  return absl::OkStatus();
}

absl::Status JsonConfig::Get(const char* key, double* value) {
  const nlohmann::json& field = Field(key);
  if (field.is_null()) return absl::OkStatus();
  if (!field.is_number()) return WrongType(key, "a number");
  *value = field.get<double>();
  return absl::OkStatus();
}

absl::Status JsonConfig::Get(const char* key, bool* value) {
  const nlohmann::json& field = Field(key);
  if (field.is_null()) return absl::OkStatus();
  if (!field.is_boolean()) return WrongType(key, "true or false");
  *value = field.get<bool>();
  return absl::OkStatus();
}

absl::Status JsonConfig::Get(const char* key, std::string* value) {
  const nlohmann::json& field = Field(key);
  if (field.is_null()) return absl::OkStatus();
  if (!field.is_string()) return WrongType(key, "a string");
  *value = field.get<std::string>();
  return absl::OkStatus();
}

absl::Status JsonConfig::Get(const char* key, std::vector<int64_t>* value) {
  const nlohmann::json& field = Field(key);
  if (field.is_null()) return absl::OkStatus();
  if (!field.is_array()) return WrongType(key, "a list of integers");
  for (const auto& item : field) {
    if (!item.is_number_integer()) return WrongType(key, "a list of integers");
  }
  *value = field.get<std::vector<int64_t>>();
  return absl::OkStatus();
}

absl::Status JsonConfig::Get(const char* key, std::vector<std::string>* value) {
  const nlohmann::json& field = Field(key);
  if (field.is_null()) return absl::OkStatus();
  if (!field.is_array()) return WrongType(key, "a list of strings");
  for (const auto& item : field) {
    if (!item.is_string()) return WrongType(key, "a list of strings");
  }
  *value = field.get<std::vector<std::string>>();
  return absl::OkStatus();
}

absl::Status JsonConfig::Get(const char* key, std::vector<double>* value) {
  const nlohmann::json& field = Field(key);
  if (field.is_null()) return absl::OkStatus();
  if (!field.is_array()) return WrongType(key, "a list of numbers");
  for (const auto& item : field) {
    if (!item.is_number()) return WrongType(key, "a list of numbers");
  }
  *value = field.get<std::vector<double>>();
  return absl::OkStatus();
}

absl::Status JsonConfig::Get(const char* key, std::vector<bool>* value) {
  const nlohmann::json& field = Field(key);
  if (field.is_null()) return absl::OkStatus();
  if (!field.is_array()) return WrongType(key, "a list of true/false");
  value->clear();
  for (const auto& item : field) {
    if (!item.is_boolean()) return WrongType(key, "a list of true/false");
    value->push_back(item.get<bool>());
  }
  return absl::OkStatus();
}

absl::Status JsonConfig::Get(const char* key, std::optional<double>* value) {
  const nlohmann::json& field = Field(key);
  if (field.is_null()) return absl::OkStatus();
  if (!field.is_number()) return WrongType(key, "a number or null");
  *value = field.get<double>();
  return absl::OkStatus();
}

absl::StatusOr<JsonConfig> JsonConfig::Object(const char* key) {
  const nlohmann::json& field = Field(key);
  if (!field.is_null() && !field.is_object()) return WrongType(key, "an object");
  JsonConfig object;
  object.name_ = absl::StrCat(name_, ": ", key);
  object.json_ =
      std::make_shared<nlohmann::json>(field.is_null() ? nlohmann::json::object() : field);
  return object;
}

void JsonConfig::Ignore(std::initializer_list<const char*> keys) {
  for (const char* key : keys) ignored_.insert(key);
}

void JsonConfig::IgnorePretrainedConfigKeys() {
  for (const char* key : {"add_cross_attention",
                          "bad_words_ids",
                          "begin_suppress_tokens",
                          "chunk_size_feed_forward",
                          "cross_attention_hidden_size",
                          "decoder_start_token_id",
                          "diversity_penalty",
                          "do_sample",
                          "early_stopping",
                          "encoder_no_repeat_ngram_size",
                          "exponential_decay_length_penalty",
                          "finetuning_task",
                          "forced_bos_token_id",
                          "forced_eos_token_id",
                          "id2label",
                          "is_encoder_decoder",
                          "label2id",
                          "length_penalty",
                          "max_length",
                          "min_length",
                          "no_repeat_ngram_size",
                          "num_beam_groups",
                          "num_beams",
                          "num_return_sequences",
                          "output_attentions",
                          "output_hidden_states",
                          "output_scores",
                          "prefix",
                          "problem_type",
                          "pruned_heads",
                          "remove_invalid_values",
                          "repetition_penalty",
                          "return_dict",
                          "return_dict_in_generate",
                          "sep_token_id",
                          "suppress_tokens",
                          "task_specific_params",
                          "temperature",
                          "tf_legacy_loss",
                          "tie_encoder_decoder",
                          "tokenizer_class",
                          "top_k",
                          "top_p",
                          "torchscript",
                          "typical_p",
                          "use_bfloat16",
                          "architectures",
                          "dtype",
                          "torch_dtype",
                          "transformers_version"}) {
    ignored_.insert(key);
  }
}

absl::Status JsonConfig::Unsupported(const char* key) {
  const nlohmann::json& field = Field(key);
  if (field.is_null() || field == false) return absl::OkStatus();
  return absl::UnimplementedError(
      absl::StrCat(name_, ": '", key, "' = ", field.dump(), " is not supported by dray"));
}

absl::Status JsonConfig::Finish() const {
  std::vector<std::string> unknown;
  for (const auto& [key, value] : json_->items()) {
    if (key.rfind('_', 0) != 0 && known_.count(key) == 0 && ignored_.count(key) == 0)
      unknown.push_back(key);
  }
  if (unknown.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(name_, ": unknown key", unknown.size() > 1 ? "s " : " ",
                   absl::StrJoin(unknown, ", "), "; known keys: ", absl::StrJoin(known_, ", ")));
}

}  // namespace dray
