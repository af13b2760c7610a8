#include "workers/config/yaml_config.h"

#include <set>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"

namespace dray {
namespace {

const ConfigKey* Find(const std::vector<ConfigKey>& keys, const std::string& key) {
  for (const ConfigKey& entry : keys) {
    if (entry.key == key) return &entry;
  }
  return nullptr;
}

// SectionKeys lists what may follow `section` ("" for the top): the next
// dotted component of every key inside it, in declaration order.
std::vector<std::string> SectionKeys(const std::vector<ConfigKey>& keys,
                                     const std::string& section) {
  const std::string prefix = section.empty() ? "" : section + ".";
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (const ConfigKey& entry : keys) {
    if (entry.key.rfind(prefix, 0) != 0) continue;
    const std::string rest = entry.key.substr(prefix.size());
    const std::string next = rest.substr(0, rest.find('.'));
    if (seen.insert(next).second) names.push_back(next);
  }
  return names;
}

absl::Status Unknown(const std::vector<ConfigKey>& keys, const std::string& section,
                     const std::string& key) {
  return absl::InvalidArgumentError(
      absl::StrCat("unknown key ", section.empty() ? "" : section + ".", key,
                   "; valid keys: ", absl::StrJoin(SectionKeys(keys, section), ", ")));
}

// AtLine prefixes a failed `status` with the line of `node`, where the
// document has one (a parsed file or text, not an override).
absl::Status AtLine(const YAML::Node& node, const absl::Status& status) {
  if (status.ok() || node.Mark().is_null()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("line ", node.Mark().line + 1, ": ", status.message()));
}

// ApplySection sets the keys under `section` from `node`, a mapping.
absl::Status ApplySection(const YAML::Node& node, const std::string& section,
                          const std::vector<ConfigKey>& keys) {
  if (!node.IsMap()) {
    return AtLine(node, absl::InvalidArgumentError(absl::StrCat(
                            section.empty() ? "the document" : section, " must be a mapping")));
  }
  for (const auto& entry : node) {
    const std::string name = entry.first.as<std::string>();
    const std::string key = section.empty() ? name : absl::StrCat(section, ".", name);
    if (const ConfigKey* leaf = Find(keys, key)) {
      DRAY_RETURN_IF_ERROR(AtLine(entry.first, leaf->set(entry.second)));
      continue;
    }
    const std::vector<std::string> inner = SectionKeys(keys, key);
    if (inner.empty()) return AtLine(entry.first, Unknown(keys, section, name));
    if (entry.second.IsNull()) continue;  // an empty section
    DRAY_RETURN_IF_ERROR(ApplySection(entry.second, key, keys));
  }
  return absl::OkStatus();
}

}  // namespace

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

absl::Status ApplyYaml(const YAML::Node& document, const std::string& where,
                       const std::vector<ConfigKey>& keys) {
  if (document.IsNull()) return absl::OkStatus();
  const absl::Status applied = ApplySection(document, "", keys);
  if (applied.ok()) return applied;
  return absl::Status(applied.code(), absl::StrCat(where, ": ", applied.message()));
}

absl::Status ApplyOverride(const std::string& text, const std::vector<ConfigKey>& keys) {
  const size_t equals = text.find('=');
  if (equals == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("override '", text, "' must read KEY=VALUE"));
  }
  const std::string key = text.substr(0, equals);
  const ConfigKey* leaf = Find(keys, key);
  if (leaf == nullptr) {
    if (const std::vector<std::string> inner = SectionKeys(keys, key); !inner.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(key, " is a section; set one of its keys (",
                                                     key,
                                                     ".KEY=VALUE): ", absl::StrJoin(inner, ", ")));
    }
    // The deepest section that exists, and the first unknown part after it.
    std::string section = key.substr(0, key.rfind('.') == std::string::npos ? 0 : key.rfind('.'));
    while (!section.empty() && SectionKeys(keys, section).empty())
      section = section.substr(0, section.rfind('.') == std::string::npos ? 0 : section.rfind('.'));
    const std::string rest = key.substr(section.empty() ? 0 : section.size() + 1);
    return Unknown(keys, section, rest.substr(0, rest.find('.')));
  }
  YAML::Node value;
  try {
    value = YAML::Load(text.substr(equals + 1));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("override '", text, "': ", e.what()));
  }
  if (value.IsNull()) value = YAML::Node(std::string());  // "key=" means the empty string
  return leaf->set(value);
}

std::string KeysToYaml(const std::vector<ConfigKey>& keys) {
  YAML::Node root(YAML::NodeType::Map);
  for (const ConfigKey& entry : keys) {
    const std::vector<std::string> parts = absl::StrSplit(entry.key, '.');
    YAML::Node section = root;  // refers to root; reset() moves it down
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      if (!section[parts[i]].IsMap()) section[parts[i]] = YAML::Node(YAML::NodeType::Map);
      section.reset(section[parts[i]]);
    }
    section[parts.back()] = entry.get();
  }
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

}  // namespace dray
