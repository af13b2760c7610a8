#include "runtime/collectives/local_group.h"

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/files.h"

namespace dray {

absl::Status RunLocalGroup(int world,
                           const std::function<absl::Status(int rank, Communicator* comm)>& body,
                           absl::Duration timeout) {
  if (world < 1)
    return absl::InvalidArgumentError(absl::StrCat("a group needs at least one rank, got ", world));
  absl::StatusOr<ScratchDir> store_dir = ScratchDir::Create("dray-local-group");
  if (!store_dir.ok()) return store_dir.status();
  std::vector<absl::Status> results(world);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      GroupAddress address;
      address.rank = rank;
      address.world_size = world;
      address.store_file = store_dir->path() + "/store";
      address.timeout = timeout;
      absl::StatusOr<std::shared_ptr<Rendezvous>> rendezvous = Rendezvous::Join(address);
      absl::StatusOr<std::unique_ptr<Communicator>> comm =
          rendezvous.ok() ? CreateGlooCommunicator(*rendezvous, "local") : rendezvous.status();
      results[rank] = comm.ok() ? body(rank, comm->get()) : comm.status();
    });
  }
  for (std::thread& thread : ranks) thread.join();
  for (const absl::Status& result : results) {
    if (!result.ok()) return result;
  }
  return absl::OkStatus();
}

}  // namespace dray
