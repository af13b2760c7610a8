#include "runtime/transport/abstract_socket.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"

namespace dray {
namespace {

// AbstractAddress: `name` in the abstract namespace (sun_path[0] == 0).
sockaddr_un AbstractAddress(const std::string& name, socklen_t* length) {
  sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  const size_t size = std::min(name.size(), sizeof(address.sun_path) - 1);
  std::memcpy(address.sun_path + 1, name.data(), size);
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + size);
  return address;
}

}  // namespace

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    Reset();
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void Fd::Reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::Status SocketError(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", strerror(errno)));
}

std::string NewAbstractName(absl::string_view prefix) {
  absl::BitGen random;
  return absl::StrCat(prefix, "-", getpid(), "-", absl::Hex(absl::Uniform<uint64_t>(random)));
}

absl::StatusOr<Fd> ListenAbstract(const std::string& name, int type) {
  Fd listener(socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!listener.valid()) return SocketError("socket");
  socklen_t length = 0;
  const sockaddr_un address = AbstractAddress(name, &length);
  if (bind(listener.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0) {
    return SocketError(absl::StrCat("binding ", name));
  }
  if (listen(listener.get(), 64) != 0) return SocketError(absl::StrCat("listening on ", name));
  return listener;
}

absl::StatusOr<Fd> ConnectAbstract(const std::string& name, int type) {
  Fd peer(socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!peer.valid()) return SocketError("socket");
  socklen_t length = 0;
  const sockaddr_un address = AbstractAddress(name, &length);
  if (connect(peer.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0) {
    return SocketError(absl::StrCat("connecting to ", name));
  }
  return peer;
}

}  // namespace dray
