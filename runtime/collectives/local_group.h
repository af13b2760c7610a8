// RunLocalGroup runs `body` on `world` threads of this process, each a rank
// of a real Gloo group (its own TCPStore rendezvous on a free loopback port):
// for tests and benchmarks of collective code without spawning processes.
//
//   DRAY_RETURN_IF_ERROR(RunLocalGroup(4, [](int rank, Communicator* comm) {
//     at::Tensor x = at::ones({3});
//     return comm->AllReduce(x);
//   }));
//
// Returns the error of the lowest failing rank. A rank that fails early can
// leave its peers waiting in a collective until the group's timeout.
#ifndef DRAY_RUNTIME_COLLECTIVES_LOCAL_GROUP_H_
#define DRAY_RUNTIME_COLLECTIVES_LOCAL_GROUP_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/collectives/communicator.h"

namespace dray {

absl::Status RunLocalGroup(int world,
                           const std::function<absl::Status(int rank, Communicator* comm)>& body,
                           absl::Duration timeout = absl::Minutes(1));

}  // namespace dray

#endif  // DRAY_RUNTIME_COLLECTIVES_LOCAL_GROUP_H_
