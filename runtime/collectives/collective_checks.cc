#include "runtime/collectives/collective_checks.h"

#include "absl/strings/str_cat.h"

namespace dray {

absl::Status CheckRoot(absl::string_view collective, int root, int world_size) {
  if (root >= 0 && root < world_size) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(collective, ": root ", root, " is not a rank of ", world_size));
}

absl::Status CheckParts(absl::string_view collective, const at::Tensor& part,
                        const at::Tensor& whole, int world_size) {
  if (whole.numel() == part.numel() * world_size && whole.scalar_type() == part.scalar_type()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(collective, ": ", world_size, " parts of ", part.numel(), " elements of ",
                   c10::toString(part.scalar_type()), " expected, got ", whole.numel(), " of ",
                   c10::toString(whole.scalar_type())));
}

absl::Status CheckAllToAll(const at::Tensor& input, const at::Tensor& output, int world_size) {
  if (input.numel() % world_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "all_to_all: ", input.numel(), " elements do not split into ", world_size, " equal parts"));
  }
  if (output.numel() == input.numel() && output.scalar_type() == input.scalar_type())
    return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("all_to_all: the output must match the input's ", input.numel(), " elements of ",
                   c10::toString(input.scalar_type()), ", got ", output.numel(), " of ",
                   c10::toString(output.scalar_type())));
}

}  // namespace dray
