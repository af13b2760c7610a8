// The c10d store behind Rendezvous::Store, for communicator implementations
// only: it pulls in c10d's headers, which other code should not pay for.
#ifndef DRAY_RUNTIME_COLLECTIVES_RENDEZVOUS_STORE_H_
#define DRAY_RUNTIME_COLLECTIVES_RENDEZVOUS_STORE_H_

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "runtime/collectives/communicator.h"

namespace dray {

struct Rendezvous::Store {
  c10::intrusive_ptr<c10d::Store> store;
};

}  // namespace dray

#endif  // DRAY_RUNTIME_COLLECTIVES_RENDEZVOUS_STORE_H_
