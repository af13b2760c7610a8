#include "workers/edit/edit_config.h"

#include <functional>

#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "runtime/sharding/strategy.h"

namespace dray {
namespace {

// Field: one key, how to set it from YAML and how to print it.
struct Field {
  const char* name;
  std::function<absl::Status(ImageEditConfig&, const YAML::Node&)> set;
  std::function<YAML::Node(const ImageEditConfig&)> get;
};

template <typename T>
Field MakeField(const char* name, T ImageEditConfig::*member, const char* type) {
  return {name,
          [=](ImageEditConfig& config, const YAML::Node& value) -> absl::Status {
            try {
              if (value.IsScalar()) {
                config.*member = value.as<T>();
                return absl::OkStatus();
              }
            } catch (const YAML::Exception&) {
            }
            return absl::InvalidArgumentError(absl::StrCat(
                kConfigSection, ".", name, " must be ", type, ", got '", YAML::Dump(value), "'"));
          },
          [=](const ImageEditConfig& config) { return YAML::Node(config.*member); }};
}

const std::vector<Field>& Fields() {
  static const std::vector<Field>* fields = new std::vector<Field>{
      MakeField("model_path", &ImageEditConfig::model_path, "a path"),
      MakeField("enable_fsdp", &ImageEditConfig::enable_fsdp, "true or false"),
      MakeField("fsdp_sharding_strategy", &ImageEditConfig::fsdp_sharding_strategy,
                "a strategy name"),
      MakeField("fsdp_cpu_offload", &ImageEditConfig::fsdp_cpu_offload, "true or false"),
      MakeField("fsdp_sync_module_states", &ImageEditConfig::fsdp_sync_module_states,
                "true or false"),
      MakeField("enable_cpu_offload", &ImageEditConfig::enable_cpu_offload, "true or false"),
      MakeField("torch_dtype", &ImageEditConfig::torch_dtype, "a dtype name"),
      MakeField("batch_size", &ImageEditConfig::batch_size, "an integer"),
      MakeField("image_size", &ImageEditConfig::image_size, "an integer"),
      MakeField("max_pixels", &ImageEditConfig::max_pixels, "an integer"),
      MakeField("max_prompt_tokens", &ImageEditConfig::max_prompt_tokens, "an integer"),
      MakeField("true_cfg_scale", &ImageEditConfig::true_cfg_scale, "a number"),
      MakeField("num_inference_steps", &ImageEditConfig::num_inference_steps, "an integer"),
      MakeField("negative_prompt", &ImageEditConfig::negative_prompt, "a string"),
      MakeField("seed", &ImageEditConfig::seed, "an integer"),
      MakeField("device", &ImageEditConfig::device, "a device (cpu, cuda, cuda:N)"),
  };
  return *fields;
}

absl::Status Set(ImageEditConfig& config, const std::string& key, const YAML::Node& value) {
  for (const Field& field : Fields()) {
    if (key == field.name) return field.set(config, value);
  }
  std::vector<std::string> names;
  for (const Field& field : Fields()) names.push_back(field.name);
  return absl::InvalidArgumentError(absl::StrCat("unknown key ", kConfigSection, ".", key,
                                                 "; valid keys: ", absl::StrJoin(names, ", ")));
}

// ApplyDocument applies the `worker: image_edit:` section of a YAML
// document; errors name `where` (a file, or "config").
absl::Status ApplyDocument(const YAML::Node& root, const std::string& where,
                           ImageEditConfig& config) {
  if (root.IsNull()) return absl::OkStatus();
  auto only = [&](const YAML::Node& node, const char* key,
                  const std::string& path) -> absl::Status {
    if (!node.IsMap())
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", path, " must be a mapping"));
    for (const auto& entry : node) {
      if (entry.first.as<std::string>() != key) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": unknown key ", path.empty() ? "" : path + ".",
                         entry.first.as<std::string>(), "; valid keys: ", key));
      }
    }
    return absl::OkStatus();
  };
  DRAY_RETURN_IF_ERROR(only(root, "worker", ""));
  DRAY_RETURN_IF_ERROR(only(root["worker"], "image_edit", "worker"));
  const YAML::Node section = root["worker"]["image_edit"];
  if (section.IsNull()) return absl::OkStatus();
  if (!section.IsMap())
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", kConfigSection, " must be a mapping"));
  for (const auto& entry : section) {
    absl::Status set = Set(config, entry.first.as<std::string>(), entry.second);
    if (!set.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", set.message()));
  }
  return absl::OkStatus();
}

// ParseYaml reads a YAML document from `text` (a file when `is_path`).
absl::StatusOr<YAML::Node> ParseYaml(const std::string& text, bool is_path) {
  const std::string where = is_path ? text : "config";
  try {
    return is_path ? YAML::LoadFile(text) : YAML::Load(text);
  } catch (const YAML::BadFile&) {
    return absl::NotFoundError(absl::StrCat("cannot read config file ", text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not valid YAML: ", e.what()));
  }
}

absl::Status ApplyOverride(const std::string& text, ImageEditConfig& config) {
  const size_t equals = text.find('=');
  const std::string prefix = absl::StrCat(kConfigSection, ".");
  if (equals == std::string::npos || text.rfind(prefix, 0) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("override '", text, "' must read ", prefix, "KEY=VALUE"));
  }
  YAML::Node value;
  try {
    value = YAML::Load(text.substr(equals + 1));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("override '", text, "': ", e.what()));
  }
  if (value.IsNull()) value = YAML::Node(std::string());  // "key=" means the empty string
  return Set(config, text.substr(prefix.size(), equals - prefix.size()), value);
}

absl::Status Validate(const ImageEditConfig& c) {
  auto bad = [](const char* key, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(kConfigSection, ".", key, " ", why));
  };
  if (c.batch_size < 1) return bad("batch_size", "must be at least 1");
  if (c.image_size < 16 || c.image_size > 4096) return bad("image_size", "must lie in [16, 4096]");
  if (c.max_pixels < 256 || c.max_pixels > kMaxOutputPixels)
    return bad("max_pixels", absl::StrCat("must lie in [256, ", kMaxOutputPixels, "]"));
  if (c.image_size * c.image_size > c.max_pixels) {
    return bad("image_size", absl::StrCat("^2 = ", c.image_size * c.image_size,
                                          " exceeds max_pixels = ", c.max_pixels));
  }
  if (c.max_prompt_tokens < 1 || c.max_prompt_tokens > kMaxPromptTokens)
    return bad("max_prompt_tokens", absl::StrCat("must lie in [1, ", kMaxPromptTokens, "]"));
  if (c.num_inference_steps < 1) return bad("num_inference_steps", "must be at least 1");
  if (!(c.true_cfg_scale >= 0)) return bad("true_cfg_scale", "must be >= 0");
  if (c.seed < 0) return bad("seed", "must be >= 0");
  if (c.torch_dtype != "float32" && c.torch_dtype != "bfloat16" && c.torch_dtype != "float16") {
    return bad("torch_dtype",
               absl::StrCat("'", c.torch_dtype, "' is not one of float32, bfloat16, float16"));
  }
  if (c.device != "cpu" && c.device != "cuda" && c.device.rfind("cuda:", 0) != 0) {
    return bad("device", absl::StrCat("'", c.device, "' is not cpu, cuda or cuda:N"));
  }
  if (c.device == "cpu" && c.torch_dtype != "float32") {
    // LibTorch 1.13's CPU kernels lack float16 matmuls, and its bfloat16 ones
    // die with SIGILL on CPUs without AVX512-BF16 (seen on the CI machine).
    return bad("torch_dtype",
               absl::StrCat(c.torch_dtype, " needs device cuda; on cpu use float32"));
  }
  absl::StatusOr<ShardingStrategy> strategy = ParseShardingStrategy(c.fsdp_sharding_strategy);
  if (!strategy.ok())
    return bad("fsdp_sharding_strategy", std::string(strategy.status().message()));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ImageEditConfig> ImageEditConfig::Load(const std::string& yaml_path,
                                                      const std::vector<std::string>& overrides) {
  YAML::Node document;
  if (!yaml_path.empty()) {
    DRAY_ASSIGN_OR_RETURN(document, ParseYaml(yaml_path, /*is_path=*/true));
  }
  auto resolve = [&](ImageEditConfig config) -> absl::StatusOr<ImageEditConfig> {
    DRAY_RETURN_IF_ERROR(ApplyDocument(document, yaml_path, config));
    for (const std::string& text : overrides) DRAY_RETURN_IF_ERROR(ApplyOverride(text, config));
    DRAY_RETURN_IF_ERROR(Validate(config));
    return config;
  };
  DRAY_ASSIGN_OR_RETURN(ImageEditConfig config, resolve(ImageEditConfig()));
  if (!config.model_path.empty()) return config;
  ImageEditConfig embedded;  // what the tiny model needs: unset keys take these instead
  embedded.num_inference_steps = kEmbeddedSteps;
  embedded.image_size = kEmbeddedImageSize;
  return resolve(embedded);
}

absl::StatusOr<ImageEditConfig> ImageEditConfig::FromYaml(const std::string& text) {
  DRAY_ASSIGN_OR_RETURN(YAML::Node document, ParseYaml(text, /*is_path=*/false));
  ImageEditConfig config;
  DRAY_RETURN_IF_ERROR(ApplyDocument(document, "config", config));
  DRAY_RETURN_IF_ERROR(Validate(config));
  return config;
}

std::string ImageEditConfig::ToYaml() const {
  YAML::Emitter out;
  out << YAML::BeginMap << YAML::Key << "worker" << YAML::Value << YAML::BeginMap << YAML::Key
      << "image_edit" << YAML::Value << YAML::BeginMap;
  for (const Field& field : Fields())
    out << YAML::Key << field.name << YAML::Value << field.get(*this);
  out << YAML::EndMap << YAML::EndMap << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace dray
