#include <chrono>
#include <exception>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/str_cat.h"
#include "base/exception_message.h"
#include "base/libtorch_compat.h"
#include "runtime/collectives/communicator.h"
#include "runtime/collectives/rendezvous_store.h"

namespace dray {
namespace {

std::string StoreName(const GroupAddress& address) {
  if (!address.store_file.empty()) return address.store_file;
  return absl::StrCat(address.master_addr, ":", address.master_port);
}

}  // namespace

Rendezvous::Rendezvous(GroupAddress address, std::unique_ptr<Store> store)
    : address_(std::move(address)), store_(std::move(store)) {}

Rendezvous::~Rendezvous() = default;

absl::StatusOr<std::shared_ptr<Rendezvous>> Rendezvous::Join(const GroupAddress& address) {
  const bool port_needed = address.store_file.empty();
  if (address.world_size < 1 || address.rank < 0 || address.rank >= address.world_size ||
      (port_needed && (address.master_port <= 0 || address.master_port > 65535))) {
    return absl::InvalidArgumentError(absl::StrCat("bad group address: rank ", address.rank, " of ",
                                                   address.world_size, " at ", StoreName(address)));
  }
  try {
    auto store = std::make_unique<Store>();
    if (!address.store_file.empty()) {
      store->store = c10::make_intrusive<c10d::FileStore>(address.store_file, address.world_size);
      store->store->setTimeout(
          std::chrono::milliseconds(absl::ToInt64Milliseconds(address.timeout)));
      return std::shared_ptr<Rendezvous>(new Rendezvous(address, std::move(store)));
    }
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(address.master_port);
    options.isServer = address.rank == 0;
    options.numWorkers = address.world_size;
    options.timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(address.timeout));
    UseClassicTcpStore(options);
    store->store = c10::make_intrusive<c10d::TCPStore>(address.master_addr, options);
    return std::shared_ptr<Rendezvous>(new Rendezvous(address, std::move(store)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("rank ", address.rank,
                                               " could not reach the group's store at ",
                                               StoreName(address), ": ", ExceptionMessage(e)));
  }
}

absl::StatusOr<std::vector<int>> GroupRanks(const GroupAddress& address, std::vector<int> ranks) {
  if (ranks.empty()) {
    for (int rank = 0; rank < address.world_size; ++rank) ranks.push_back(rank);
  }
  bool member = false;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= address.world_size || (i > 0 && ranks[i] <= ranks[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("group ranks must be sorted, distinct ranks below ", address.world_size));
    }
    member |= ranks[i] == address.rank;
  }
  if (!member)
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", address.rank, " is not in the group it joins"));
  return ranks;
}

}  // namespace dray
