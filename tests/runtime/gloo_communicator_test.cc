// Gloo collectives between the threads of one process (RunLocalGroup):
// the all-to-all that sequence parallelism exchanges sequence parts for
// heads with, at several group sizes and dtypes, and its shape checks.
#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/collectives/local_group.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::HasSubstr;

// Part `to` of rank `from`'s input: values that name both.
at::Tensor Part(int from, int to, at::ScalarType dtype) {
  return (at::arange(3) + 10 * to + 100 * from).to(dtype);
}

TEST(GlooCommunicatorTest, AllToAllSendsPartIToRankI) {
  for (int world : {1, 2, 3, 4}) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
      SCOPED_TRACE(::testing::Message() << world << " ranks, " << c10::toString(dtype));
      DRAY_EXPECT_OK(RunLocalGroup(world, [&](int rank, Communicator* comm) -> absl::Status {
        std::vector<at::Tensor> parts, expected;
        for (int peer = 0; peer < world; ++peer) {
          parts.push_back(Part(rank, peer, dtype));
          expected.push_back(Part(peer, rank, dtype));
        }
        at::Tensor received = at::zeros({world * 3}, dtype);
        DRAY_RETURN_IF_ERROR(comm->AllToAll(at::cat(parts), received));
        if (!at::equal(received, at::cat(expected)))
          return absl::InternalError(absl::StrCat("rank ", rank, " received the wrong parts"));
        return absl::OkStatus();
      }));
    }
  }
}

TEST(GlooCommunicatorTest, AllToAllRefusesPartsThatDoNotMatch) {
  DRAY_EXPECT_OK(RunLocalGroup(2, [](int, Communicator* comm) -> absl::Status {
    at::Tensor output = at::zeros({6});
    EXPECT_THAT(comm->AllToAll(at::zeros({5}), output),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("5 elements do not split into 2 equal parts")));
    EXPECT_THAT(comm->AllToAll(at::zeros({6}, at::kLong), output),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("all_to_all")));
    return absl::OkStatus();
  }));
}

}  // namespace
}  // namespace dray
