#include "runtime/net/host_address.h"

#include <algorithm>
#include <string>
#include <vector>

#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ResolveIPv4Test, ReturnsAddressesAsTheyAreAndResolvesNames) {
  DRAY_ASSERT_OK_AND_ASSIGN(const std::string address, ResolveIPv4("10.77.0.11"));
  EXPECT_EQ(address, "10.77.0.11");
  DRAY_ASSERT_OK_AND_ASSIGN(const std::string localhost, ResolveIPv4("localhost"));
  EXPECT_EQ(localhost, "127.0.0.1");
}

TEST(ResolveIPv4Test, NamesAHostThatDoesNotResolve) {
  EXPECT_THAT(ResolveIPv4("no-such-host.invalid"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("'no-such-host.invalid'")));
}

TEST(AddressBeforeTest, OrdersAddressesAsNumbersAndNamesAfterThem) {
  std::vector<std::string> nodes = {"node-b", "10.89.0.10", "10.89.0.9", "node-a", "9.1.1.1"};
  std::sort(nodes.begin(), nodes.end(), AddressBefore);
  EXPECT_THAT(nodes, ElementsAre("9.1.1.1", "10.89.0.9", "10.89.0.10", "node-a", "node-b"));
}

TEST(AddressBeforeTest, OrdersNamesNaturally) {
  std::vector<std::string> nodes = {"dray-nodes-10.dray-nodes", "dray-nodes-2.dray-nodes",
                                    "dray-nodes-1.dray-nodes", "dray-nodes", "dray-nodes-02"};
  std::sort(nodes.begin(), nodes.end(), AddressBefore);
  EXPECT_THAT(nodes, ElementsAre("dray-nodes", "dray-nodes-1.dray-nodes", "dray-nodes-02",
                                 "dray-nodes-2.dray-nodes", "dray-nodes-10.dray-nodes"));
}

TEST(LocalNodeIdTest, NamesTheBootAndTheNamespaces) {
  const std::string id = LocalNodeId();
  EXPECT_THAT(id, AllOf(HasSubstr("net:["), HasSubstr("mnt:[")));
  EXPECT_EQ(LocalNodeId(), id);
}

TEST(LocalAddressTowardTest, PicksTheLoopbackTowardALoopbackPeer) {
  DRAY_ASSERT_OK_AND_ASSIGN(const std::string local, LocalAddressToward("127.0.0.1:29400"));
  EXPECT_EQ(local, "127.0.0.1");
  EXPECT_THAT(LocalAddressToward("127.0.0.1"), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace dray
