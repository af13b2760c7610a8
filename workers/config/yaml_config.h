// Configuration files in verl's layout: nested YAML sections whose leaves
// are a config struct's fields, addressed by dotted keys
// ("worker.actor.lr"), with command-line overrides in the same form
// ("worker.actor.lr=1e-4", the value in YAML syntax). A config type lists
// its keys once, bound to an instance:
//
//   std::vector<ConfigKey> Keys(TrainConfig& c) {
//     return {Key("worker.actor.lr", c.lr, "a number"),
//             Key("worker.actor.lora_target_modules", c.targets, "a list of names")};
//   }
//   DRAY_RETURN_IF_ERROR(ApplyYamlFile("job.yaml", Keys(config)));
//   DRAY_RETURN_IF_ERROR(ApplyOverride("worker.actor.lr=3e-4", Keys(config)));
//   std::cout << KeysToYaml(Keys(config));  // every key, nested
//
// An unknown key is INVALID_ARGUMENT naming it and listing the valid keys
// of its section; a value of the wrong type names the key and the type.
//
// Thread-safety: keys write to the instance they are bound to.
#ifndef DRAY_WORKERS_CONFIG_YAML_CONFIG_H_
#define DRAY_WORKERS_CONFIG_YAML_CONFIG_H_

#include <charconv>
#include <cmath>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace dray {

// ConfigKey: one dotted key of a config instance: how to set it from YAML
// and how to print it.
struct ConfigKey {
  std::string key;
  std::function<absl::Status(const YAML::Node&)> set;
  std::function<YAML::Node()> get;
};

// Key binds `member` (a scalar, a string or a std::vector of them) to `key`;
// `type` says what a value must be, for errors ("an integer").
template <typename T>
ConfigKey Key(std::string key, T& member, const char* type) {
  return {key,
          [key, &member, type](const YAML::Node& value) -> absl::Status {
            try {
              if (value.IsScalar() || value.IsSequence()) {
                member = value.as<T>();
                return absl::OkStatus();
              }
            } catch (const YAML::Exception&) {
            }
            return absl::InvalidArgumentError(
                absl::StrCat(key, " must be ", type, ", got '", YAML::Dump(value), "'"));
          },
          [&member] {
            // A number as its shortest exact decimal (0.99, not 0.98999999999999999).
            if constexpr (std::is_floating_point_v<T>) {
              if (!std::isfinite(member)) return YAML::Node(member);  // .inf, .nan as YAML has them
              char text[32];
              return YAML::Node(std::string(text, std::to_chars(text, text + 32, member).ptr));
            } else {
              return YAML::Node(member);
            }
          }};
}

// ParseYaml reads a YAML document from `text`, or from the file it names
// when `is_path`.
absl::StatusOr<YAML::Node> ParseYaml(const std::string& text, bool is_path);

// ApplyYaml sets every key the document holds; errors name `where` (a
// file, or "config"). A null document sets nothing.
absl::Status ApplyYaml(const YAML::Node& document, const std::string& where,
                       const std::vector<ConfigKey>& keys);

// ApplyOverride applies one "KEY=VALUE" (VALUE in YAML syntax; "KEY=" is the
// empty string).
absl::Status ApplyOverride(const std::string& text, const std::vector<ConfigKey>& keys);

// KeysToYaml writes every key's value, nested by section.
std::string KeysToYaml(const std::vector<ConfigKey>& keys);

}  // namespace dray

#endif  // DRAY_WORKERS_CONFIG_YAML_CONFIG_H_
