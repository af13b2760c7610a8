#include "runtime/rpc/segment_passage.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "runtime/rpc/abstract_socket.h"
#include "runtime/rpc/job_secret.h"

namespace dray {
namespace {

constexpr int kHandshakeTimeoutMs = 5000;
constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL;

absl::Status Errno(absl::string_view what) {
  return SocketError(absl::StrCat("segment passage: ", what));
}

// DescriptorMessage: a segment's number with room for its descriptor
// (SCM_RIGHTS), as sendmsg and recvmsg take it.
struct DescriptorMessage {
  DescriptorMessage() {
    header.msg_iov = &data;
    header.msg_iovlen = 1;
    header.msg_control = control;
    header.msg_controllen = sizeof(control);
  }
  DescriptorMessage(const DescriptorMessage&) = delete;
  DescriptorMessage& operator=(const DescriptorMessage&) = delete;

  uint64_t number = 0;
  iovec data = {&number, sizeof(number)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr header = {};
};

// Mapping: a read-only mapping of a segment, unmapped with its last alias.
struct Mapping {
  void* address = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (address != nullptr) munmap(address, size);
  }
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Segment>> Segment::Write(const ScatteredPayload& payload) {
  Fd segment(memfd_create("dray-payload", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!segment.valid()) return Errno("memfd_create");
  if (ftruncate(segment.get(), static_cast<off_t>(payload.size)) != 0) return Errno("ftruncate");
  off_t offset = 0;
  for (const Bytes& piece : payload.pieces) {
    for (size_t written = 0; written < piece.size();) {
      const ssize_t n = pwrite(segment.get(), piece.data() + written, piece.size() - written,
                               offset + static_cast<off_t>(written));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Errno("writing a segment");
      written += static_cast<size_t>(n);
    }
    offset += static_cast<off_t>(piece.size());
  }
  if (fcntl(segment.get(), F_ADD_SEALS, kSeals) != 0) return Errno("sealing a segment");
  return std::shared_ptr<const Segment>(new Segment(segment.Release(), payload.size));
}

Segment::~Segment() { close(fd_); }

absl::StatusOr<std::shared_ptr<const Segment>> SharedSegment::Get(const ScatteredPayload& payload) {
  absl::MutexLock lock(&mu_);
  if (segment_ == nullptr) {
    DRAY_ASSIGN_OR_RETURN(segment_, Segment::Write(payload));
  }
  return segment_;
}

class SegmentPassage::Impl {
 public:
  Impl(std::string address, std::string secret)
      : address_(std::move(address)), secret_(std::move(secret)) {}

  ~Impl() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      if (listener_.valid()) shutdown(listener_.get(), SHUT_RDWR);  // wakes accept
      if (peer_.valid()) shutdown(peer_.get(), SHUT_RDWR);          // wakes recvmsg
    }
    if (thread_.joinable()) thread_.join();
  }

  absl::Status Listen() {
    absl::StatusOr<Fd> listener = ListenAbstract(address_, SOCK_SEQPACKET);
    if (!listener.ok()) {
      return absl::UnavailableError(absl::StrCat("segment passage: ", listener.status().message()));
    }
    listener_ = std::move(listener).value();
    thread_ = std::thread([this] {
      if (AcceptPeer()) ReadSegments();
    });
    return absl::OkStatus();
  }

  absl::Status Connect() {
    absl::StatusOr<Fd> peer = ConnectAbstract(address_, SOCK_SEQPACKET);
    if (!peer.ok()) {
      return absl::UnavailableError(absl::StrCat("segment passage: ", peer.status().message()));
    }
    if (send(peer->get(), secret_.data(), secret_.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(secret_.size())) {
      return Errno("showing the job secret");
    }
    {
      absl::MutexLock lock(&mu_);
      peer_ = std::move(peer).value();
    }
    thread_ = std::thread([this] { ReadSegments(); });
    return absl::OkStatus();
  }

  const std::string& address() const { return address_; }

  bool connected() const {
    absl::MutexLock lock(&mu_);
    return peer_.valid() && !closed_;
  }

  absl::StatusOr<uint64_t> Send(const Segment& segment) {
    absl::MutexLock lock(&send_mu_);
    const uint64_t number = next_number_++;
    int peer;
    {
      absl::MutexLock state(&mu_);
      if (!peer_.valid()) return absl::FailedPreconditionError("segment passage: no peer yet");
      peer = peer_.get();
    }
    DescriptorMessage message;
    message.number = number;
    cmsghdr* rights = CMSG_FIRSTHDR(&message.header);
    rights->cmsg_level = SOL_SOCKET;
    rights->cmsg_type = SCM_RIGHTS;
    rights->cmsg_len = CMSG_LEN(sizeof(int));
    const int fd = segment.fd();
    std::memcpy(CMSG_DATA(rights), &fd, sizeof(fd));
    if (sendmsg(peer, &message.header, MSG_NOSIGNAL) != sizeof(number)) {
      return Errno("passing a segment");
    }
    return number;  // the peer holds its own descriptor now
  }

  absl::StatusOr<Bytes> Receive(uint64_t number, uint64_t size, absl::Duration timeout) {
    Fd segment;
    {
      absl::MutexLock lock(&mu_);
      auto arrived = [this, number]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return closed_ || segments_.count(number) > 0;
      };
      mu_.AwaitWithTimeout(absl::Condition(&arrived), timeout);
      auto found = segments_.find(number);
      if (found == segments_.end()) {
        return absl::UnavailableError(
            absl::StrCat("segment passage: segment ", number,
                         closed_ ? " never came: the peer went away" : " did not come in time"));
      }
      segment = std::move(found->second);
      segments_.erase(found);
    }
    struct stat file = {};
    if (fstat(segment.get(), &file) != 0) return Errno("fstat");
    if (static_cast<uint64_t>(file.st_size) < size ||
        (fcntl(segment.get(), F_GET_SEALS) & kSeals) != kSeals) {
      return absl::InvalidArgumentError(absl::StrCat("segment passage: segment ", number, " has ",
                                                     file.st_size, " sealed bytes, not ", size));
    }
    if (size == 0) return Bytes();
    auto mapping = std::make_shared<Mapping>();
    void* address = mmap(nullptr, size, PROT_READ, MAP_SHARED | MAP_POPULATE, segment.get(), 0);
    if (address == MAP_FAILED) return Errno("mapping a segment");
    mapping->address = address;
    mapping->size = size;
    return Bytes::Alias(mapping, absl::string_view(static_cast<const char*>(address), size));
  }

 private:
  // AcceptPeer accepts connections until one shows the secret; false when stopped.
  bool AcceptPeer() {
    int listener;
    {
      absl::MutexLock lock(&mu_);
      listener = listener_.get();
    }
    while (true) {
      Fd peer(accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
      const int error = errno;
      const bool shown = peer.valid() && ShowsSecret(peer.get());
      absl::MutexLock lock(&mu_);
      if (stopping_) return false;
      if (shown) {
        peer_ = std::move(peer);
        listener_.Reset();  // one peer only
        return true;
      }
      if (!peer.valid() && error != EINTR && error != ECONNABORTED) {
        closed_ = true;
        return false;
      }
    }
  }

  // ShowsSecret: whether `peer`'s first message is the job secret, compared
  // in constant time.
  bool ShowsSecret(int peer) const {
    pollfd ready = {peer, POLLIN, 0};
    if (poll(&ready, 1, kHandshakeTimeoutMs) != 1) return false;
    std::string shown(secret_.size() + 1, '\0');
    if (recv(peer, shown.data(), shown.size(), 0) != static_cast<ssize_t>(secret_.size())) {
      return false;
    }
    return dray::ShowsSecret(absl::string_view(shown.data(), secret_.size()), secret_);
  }

  // ReadSegments files every segment the peer passes until it goes away.
  void ReadSegments() {
    int peer;
    {
      absl::MutexLock lock(&mu_);
      peer = peer_.get();
    }
    while (true) {
      DescriptorMessage message;
      const ssize_t n = recvmsg(peer, &message.header, MSG_CMSG_CLOEXEC);
      if (n < 0 && errno == EINTR) continue;
      const cmsghdr* rights =
          n == sizeof(message.number) ? CMSG_FIRSTHDR(&message.header) : nullptr;
      absl::MutexLock lock(&mu_);
      if (rights == nullptr || rights->cmsg_type != SCM_RIGHTS) {
        closed_ = true;  // the peer went away (or broke the protocol)
        return;
      }
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(rights), sizeof(fd));
      segments_[message.number] = Fd(fd);
    }
  }

  const std::string address_;
  const std::string secret_;
  std::thread thread_;  // accepts the peer, then reads its segments
  absl::Mutex send_mu_;
  uint64_t next_number_ ABSL_GUARDED_BY(send_mu_) = 1;
  mutable absl::Mutex mu_;
  Fd listener_ ABSL_GUARDED_BY(mu_);
  Fd peer_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, Fd> segments_ ABSL_GUARDED_BY(mu_);  // arrived, not yet received
};

absl::StatusOr<std::unique_ptr<SegmentPassage>> SegmentPassage::Listen(std::string job_secret) {
  auto impl = std::make_unique<Impl>(NewAbstractName("dray-segments"), std::move(job_secret));
  DRAY_RETURN_IF_ERROR(impl->Listen());
  return std::unique_ptr<SegmentPassage>(new SegmentPassage(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<SegmentPassage>> SegmentPassage::Connect(
    const std::string& address, const std::string& job_secret) {
  auto impl = std::make_unique<Impl>(address, job_secret);
  DRAY_RETURN_IF_ERROR(impl->Connect());
  return std::unique_ptr<SegmentPassage>(new SegmentPassage(std::move(impl)));
}

SegmentPassage::SegmentPassage(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SegmentPassage::~SegmentPassage() = default;

const std::string& SegmentPassage::address() const { return impl_->address(); }
bool SegmentPassage::connected() const { return impl_->connected(); }
absl::StatusOr<uint64_t> SegmentPassage::Send(const Segment& segment) {
  return impl_->Send(segment);
}
absl::StatusOr<Bytes> SegmentPassage::Receive(uint64_t number, uint64_t size,
                                              absl::Duration timeout) {
  return impl_->Receive(number, size, timeout);
}

}  // namespace dray
