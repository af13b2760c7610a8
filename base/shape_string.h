// ShapeString formats a tensor shape for error messages: "[2, 3, 4]".
#ifndef DRAY_BASE_SHAPE_STRING_H_
#define DRAY_BASE_SHAPE_STRING_H_

#include <string>

#include <c10/util/ArrayRef.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dray {

inline std::string ShapeString(c10::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace dray

#endif  // DRAY_BASE_SHAPE_STRING_H_
