// Host addresses as the cluster code needs them: a name resolved to the IPv4
// address that other machines reach (a controller's --listen may name its own
// host, as `controller:29400` in a compose network or a pod's DNS name), and
// the local address on the route toward a peer (what a node agent announces).
#ifndef DRAY_RUNTIME_NET_HOST_ADDRESS_H_
#define DRAY_RUNTIME_NET_HOST_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"

namespace dray {

// ResolveIPv4 returns `host`'s first IPv4 address, as dotted text (a literal
// address comes back as it is); NOT_FOUND naming `host` if it has none.
absl::StatusOr<std::string> ResolveIPv4(const std::string& host);

// AddressBefore orders node addresses as numbers (10.0.0.9 before
// 10.0.0.10), and names after them in natural order (node-2 before node-10).
bool AddressBefore(const std::string& a, const std::string& b);

// LocalNodeId tells this machine and its network and mount namespaces
// apart from any other: processes with equal ids reach each other's unix
// sockets (abstract ones live in a network namespace) and share /dev/shm.
// Empty if /proc cannot say.
std::string LocalNodeId();

// LocalAddressToward returns this machine's IPv4 address on the route to
// `host_port`'s host (nothing is sent).
absl::StatusOr<std::string> LocalAddressToward(const std::string& host_port);

}  // namespace dray

#endif  // DRAY_RUNTIME_NET_HOST_ADDRESS_H_
