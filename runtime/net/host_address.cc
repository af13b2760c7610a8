#include "runtime/net/host_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "absl/strings/ascii.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/files.h"
#include "base/status_macros.h"

namespace dray {

absl::StatusOr<std::string> ResolveIPv4(const std::string& host) {
  addrinfo hints = {};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int error = getaddrinfo(host.c_str(), nullptr, &hints, &found); error != 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot resolve '", host, "' to an IPv4 address: ", gai_strerror(error)));
  }
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, text, sizeof(text));
  freeaddrinfo(found);
  return std::string(text);
}

bool AddressBefore(const std::string& a, const std::string& b) {
  in_addr x = {}, y = {};
  const bool a_is_ipv4 = inet_pton(AF_INET, a.c_str(), &x) == 1;
  const bool b_is_ipv4 = inet_pton(AF_INET, b.c_str(), &y) == 1;
  if (a_is_ipv4 && b_is_ipv4) return ntohl(x.s_addr) < ntohl(y.s_addr);
  if (a_is_ipv4 != b_is_ipv4) return a_is_ipv4;
  // Names in natural order: node-2 before node-10.
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (absl::ascii_isdigit(a[i]) && absl::ascii_isdigit(b[j])) {
      const size_t a_end = a.find_first_not_of("0123456789", i);
      const size_t b_end = b.find_first_not_of("0123456789", j);
      std::string_view x_digits = std::string_view(a).substr(i, a_end - i);
      std::string_view y_digits = std::string_view(b).substr(j, b_end - j);
      x_digits.remove_prefix(std::min(x_digits.find_first_not_of('0'), x_digits.size()));
      y_digits.remove_prefix(std::min(y_digits.find_first_not_of('0'), y_digits.size()));
      if (x_digits.size() != y_digits.size()) return x_digits.size() < y_digits.size();
      if (x_digits != y_digits) return x_digits < y_digits;
      i = std::min(a_end, a.size());
      j = std::min(b_end, b.size());
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j || (a.size() - i == b.size() - j && a < b);
}

std::string LocalNodeId() {
  std::string boot_id;
  if (absl::StatusOr<std::string> read = ReadFile("/proc/sys/kernel/random/boot_id"); read.ok()) {
    boot_id = std::string(absl::StripAsciiWhitespace(*read));
  }
  std::string id = boot_id;
  for (const char* name : {"/proc/self/ns/net", "/proc/self/ns/mnt"}) {
    char target[64] = {};
    const ssize_t length = readlink(name, target, sizeof(target) - 1);
    if (length <= 0 || boot_id.empty()) return "";
    absl::StrAppend(&id, " ", absl::string_view(target, length));
  }
  return id;
}

absl::StatusOr<std::string> LocalAddressToward(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", host_port, "' is not HOST:PORT"));
  }
  const std::string host = host_port.substr(0, colon);
  DRAY_ASSIGN_OR_RETURN(const std::string address, ResolveIPv4(host));
  sockaddr_in peer = {};
  peer.sin_family = AF_INET;
  peer.sin_port = htons(std::atoi(host_port.c_str() + colon + 1));
  inet_pton(AF_INET, address.c_str(), &peer.sin_addr);
  // Connecting a UDP socket sends nothing; it only picks the route.
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in local = {};
  socklen_t length = sizeof(local);
  const bool ok = fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&peer), sizeof(peer)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0;
  const int error = errno;
  if (fd >= 0) close(fd);
  if (!ok) {
    return absl::UnavailableError(
        absl::StrCat("no route to '", host, "' from this machine: ", strerror(error)));
  }
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
  return std::string(text);
}

}  // namespace dray
