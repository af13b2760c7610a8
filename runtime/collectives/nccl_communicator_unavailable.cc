// CreateNcclCommunicator in a build without CUDA (the default).
#include "runtime/collectives/communicator.h"

namespace dray {

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(std::shared_ptr<Rendezvous>,
                                                                     const std::string&, int,
                                                                     std::vector<int>) {
  return absl::UnimplementedError(
      "this dray was built without CUDA: NCCL needs a build with --config=cuda (see "
      "docs/building.md)");
}

}  // namespace dray
