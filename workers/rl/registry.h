// Lookup in the name-keyed registries of training algorithms (advantage
// estimators, policy losses, reward functions): one map literal per kind,
// in the .cc that defines the built-ins.
//
//   const std::map<std::string, PolicyLoss>& Registry() { static ... {{"grpo", ClippedGrpo}} }
//   return FindRegistered(Registry(), "policy loss", name);
//
// Thread-safety: the registries are immutable after their first use.
#ifndef DRAY_WORKERS_RL_REGISTRY_H_
#define DRAY_WORKERS_RL_REGISTRY_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace dray::rl {

// RegisteredNames lists the names of `registry`, sorted.
template <typename T>
std::vector<std::string> RegisteredNames(const std::map<std::string, T>& registry) {
  std::vector<std::string> names;
  for (const auto& entry : registry) names.push_back(entry.first);
  return names;
}

// FindRegistered returns the entry called `name`; NOT_FOUND names the
// `kind` and lists what is registered.
template <typename T>
absl::StatusOr<T> FindRegistered(const std::map<std::string, T>& registry, absl::string_view kind,
                                 absl::string_view name) {
  auto found = registry.find(std::string(name));
  if (found == registry.end()) {
    return absl::NotFoundError(absl::StrCat("unknown ", kind, " '", name, "' (registered: ",
                                            absl::StrJoin(RegisteredNames(registry), ", "), ")"));
  }
  return found->second;
}

}  // namespace dray::rl

#endif  // DRAY_WORKERS_RL_REGISTRY_H_
