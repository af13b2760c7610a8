// Sockets in Linux's abstract unix namespace, through which processes of
// one node reach each other without TCP: a name with no file behind it,
// gone with the process that bound it, reachable by any process of the node
// (so whatever listens must ask its peers for the job secret).
//
//   DRAY_ASSIGN_OR_RETURN(Fd listener, ListenAbstract(name, SOCK_STREAM));
//   DRAY_ASSIGN_OR_RETURN(Fd peer, ConnectAbstract(name, SOCK_STREAM));
//
// Thread-safety: the functions are thread-safe; an Fd is a value.
#ifndef DRAY_RUNTIME_TRANSPORT_ABSTRACT_SOCKET_H_
#define DRAY_RUNTIME_TRANSPORT_ABSTRACT_SOCKET_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dray {

// Fd: a descriptor, closed with its owner.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept;
  ~Fd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset();

 private:
  int fd_ = -1;
};

// SocketError: UNAVAILABLE naming `what` failed and errno's reason.
absl::Status SocketError(absl::string_view what);

// NewAbstractName returns `prefix`-PID-RANDOM, a name no other socket has.
std::string NewAbstractName(absl::string_view prefix);

// ListenAbstract binds a socket of `type` (SOCK_STREAM, SOCK_SEQPACKET) to
// `name` and listens on it.
absl::StatusOr<Fd> ListenAbstract(const std::string& name, int type);

// ConnectAbstract connects a socket of `type` to the one listening on `name`.
absl::StatusOr<Fd> ConnectAbstract(const std::string& name, int type);

}  // namespace dray

#endif  // DRAY_RUNTIME_TRANSPORT_ABSTRACT_SOCKET_H_
