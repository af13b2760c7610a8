// A tensor's shape and dtype as messages and configurations write them:
// ShapeString "[2, 3, 4]", DtypeName "bfloat16".
#ifndef DRAY_BASE_SHAPE_STRING_H_
#define DRAY_BASE_SHAPE_STRING_H_

#include <string>

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dray {

inline std::string ShapeString(c10::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// DtypeName: a floating dtype as configurations name it (torch_dtype:
// float32, float64, bfloat16, float16); c10's name for any other.
inline std::string DtypeName(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat:
      return "float32";
    case c10::kDouble:
      return "float64";
    case c10::kBFloat16:
      return "bfloat16";
    case c10::kHalf:
      return "float16";
    default:
      return c10::toString(dtype);
  }
}

}  // namespace dray

#endif  // DRAY_BASE_SHAPE_STRING_H_
