// Access to the diffusers reference vectors (../shared/reference, see its
// README) from tests: paths in runfiles, JSON, and tensors stored as JSON.
#ifndef DRAY_TESTS_MODELS_REFERENCE_H_
#define DRAY_TESTS_MODELS_REFERENCE_H_

#include <ATen/TensorOperators.h>
#include <ATen/ops/from_blob.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace dray {

// ReferencePath returns the path of `file` below reference/qwen_image/.
inline std::string ReferencePath(const std::string& file) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/shared_reference/qwen_image/", file);
}

inline nlohmann::json ReadReferenceJson(const std::string& file) {
  std::ifstream in(ReferencePath(file));
  return nlohmann::json::parse(in);
}

// JsonTensor reads a tensor stored as {"dtype": "float32", "shape": [...], "data": [...]}.
inline at::Tensor JsonTensor(const nlohmann::json& stored) {
  std::vector<float> data = stored["data"].get<std::vector<float>>();
  std::vector<int64_t> shape = stored["shape"].get<std::vector<int64_t>>();
  return at::from_blob(data.data(), shape, at::kFloat).clone();
}

// MaxAbsDiff returns max |a - b| (as double), or infinity when shapes differ.
inline double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) return INFINITY;
  if (a.numel() == 0) return 0;
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

}  // namespace dray

#endif  // DRAY_TESTS_MODELS_REFERENCE_H_
