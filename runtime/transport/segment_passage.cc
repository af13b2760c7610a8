#include "runtime/transport/segment_passage.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <map>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "runtime/security/job_secret.h"
#include "runtime/transport/abstract_socket.h"

namespace dray {
namespace {

constexpr int kHandshakeTimeoutMs = 5000;
// A segment's size is sealed, so that no reader can ever fault on a page
// that went away; its bytes are not: its writer reuses it once every reader
// let it go.
constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;
// The pool keeps at most this many free segments, of this much in all.
constexpr size_t kPoolSegments = 16;
constexpr uint64_t kPoolBytes = uint64_t{1} << 30;

absl::Status Errno(absl::string_view what) {
  return SocketError(absl::StrCat("segment passage: ", what));
}

// DescriptorMessage: one message of the passage, as sendmsg and recvmsg take
// it. Its words say what it is:
//   [number] with a descriptor (SCM_RIGHTS): a segment passed under `number`;
//   [number] alone: the receiver let go of segment `number`;
//   [number, segment] alone: the peer hands back this end's own `segment`
//   (a result carrying rows of its input) under `number`.
struct DescriptorMessage {
  DescriptorMessage() {
    header.msg_iov = &data;
    header.msg_iovlen = 1;
    header.msg_control = control;
    header.msg_controllen = sizeof(control);
  }
  DescriptorMessage(const DescriptorMessage&) = delete;
  DescriptorMessage& operator=(const DescriptorMessage&) = delete;

  uint64_t words[2] = {};
  iovec data = {words, sizeof(words)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr header = {};
};

// Peer: the passage's connection, which a mapping outliving the passage
// must not use, and where the peer's segments are mapped here.
struct Peer {
  explicit Peer(Fd socket) : socket(std::move(socket)) {}
  Fd socket;
  absl::Mutex mu;
  // By address: the mapping's size and the peer's number for its segment.
  std::map<const char*, std::pair<size_t, uint64_t>> mapped ABSL_GUARDED_BY(mu);
};

// Mapping: a read-only mapping of a received segment, unmapped with its
// last alias; the sender then hears that its segment is free. Or a mapping
// of this end's own segment that the peer handed back, which it keeps from
// the pool.
struct Mapping {
  void* address = nullptr;
  size_t size = 0;
  std::weak_ptr<Peer> sender;
  uint64_t number = 0;
  std::shared_ptr<const Segment> own;
  ~Mapping() {
    std::shared_ptr<Peer> peer = sender.lock();
    if (peer != nullptr) {
      absl::MutexLock lock(&peer->mu);
      peer->mapped.erase(static_cast<const char*>(address));
    }
    if (address != nullptr) munmap(address, size);
    // A message without a descriptor releases `number`. If the socket is
    // full, the sender keeps the segment until the passage closes.
    if (peer != nullptr) {
      send(peer->socket.get(), &number, sizeof(number), MSG_DONTWAIT | MSG_NOSIGNAL);
    }
  }
};

// SegmentPool: this process's written segments whose readers all let them
// go, pages still in memory: copying into them costs a memcpy, while a
// fresh segment costs as much again for its pages.
class SegmentPool {
 public:
  static SegmentPool& Global() {
    static SegmentPool* pool = new SegmentPool;
    return *pool;
  }

  // Take returns a free segment of at least `size` bytes (and not over
  // twice as many), or null.
  std::unique_ptr<Segment::Memory> Take(uint64_t size) {
    absl::MutexLock lock(&mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if ((*it)->capacity < size || (*it)->capacity > 2 * size) continue;
      std::unique_ptr<Segment::Memory> memory = std::move(*it);
      free_.erase(it);
      free_bytes_ -= memory->capacity;
      return memory;
    }
    return nullptr;
  }

  // Give keeps `memory` for a later payload, within the pool's bounds.
  void Give(std::unique_ptr<Segment::Memory> memory) {
    absl::MutexLock lock(&mu_);
    if (free_.size() == kPoolSegments || free_bytes_ + memory->capacity > kPoolBytes) return;
    free_bytes_ += memory->capacity;
    free_.push_back(std::move(memory));
  }

 private:
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Segment::Memory>> free_ ABSL_GUARDED_BY(mu_);
  uint64_t free_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// CopyRange writes bytes [begin, end) of `payload` to `to` + begin.
void CopyRange(const ScatteredPayload& payload, uint64_t begin, uint64_t end, char* to) {
  uint64_t offset = 0;
  for (const Bytes& piece : payload.pieces) {
    const uint64_t from = std::max(begin, offset), until = std::min(end, offset + piece.size());
    if (from < until) std::memcpy(to + from, piece.data() + (from - offset), until - from);
    offset += piece.size();
    if (offset >= end) return;
  }
}

// Copy writes `payload`'s pieces to `to`, a large payload in parts on
// several cores: one core's memcpy is far from the memory's bandwidth.
void Copy(const ScatteredPayload& payload, char* to) {
  constexpr uint64_t kPartBytes = uint64_t{4} << 20;
  constexpr int kMostParts = 4;
  cpu_set_t cpus;
  const int cores = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  const uint64_t parts = std::max<uint64_t>(
      1, std::min<uint64_t>({static_cast<uint64_t>(cores), kMostParts, payload.size / kPartBytes}));
  const uint64_t part = (payload.size + parts - 1) / parts;
  std::vector<std::thread> helpers;
  for (uint64_t begin = part; begin < payload.size; begin += part) {
    helpers.emplace_back(CopyRange, std::cref(payload), begin, std::min(payload.size, begin + part),
                         to);
  }
  CopyRange(payload, 0, std::min(payload.size, part), to);
  for (std::thread& helper : helpers) helper.join();
}

// WriteFresh writes `payload` into a new memfd with pwrite (faster than
// faulting its pages in through a mapping).
absl::StatusOr<Fd> WriteFresh(const ScatteredPayload& payload) {
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
  if (fcntl(segment.get(), F_ADD_SEALS, kSizeSeals | F_SEAL_SEAL) != 0) {
    return Errno("sealing a segment");
  }
  return segment;
}

}  // namespace

Segment::Memory::~Memory() {
  if (writable != nullptr) munmap(writable, capacity);
}

absl::StatusOr<std::shared_ptr<const Segment>> Segment::Write(const ScatteredPayload& payload) {
  std::unique_ptr<Memory> memory = SegmentPool::Global().Take(payload.size);
  if (memory != nullptr && memory->writable == nullptr && memory->capacity > 0) {
    void* address =
        mmap(nullptr, memory->capacity, PROT_READ | PROT_WRITE, MAP_SHARED, memory->fd.get(), 0);
    if (address == MAP_FAILED) return Errno("mapping a segment to write");
    memory->writable = address;
  }
  if (memory != nullptr) {
    Copy(payload, static_cast<char*>(memory->writable));
  } else {
    DRAY_ASSIGN_OR_RETURN(Fd fd, WriteFresh(payload));
    memory = std::make_unique<Memory>();
    memory->fd = std::move(fd);
    memory->capacity = payload.size;
  }
  return std::shared_ptr<const Segment>(new Segment(std::move(memory), payload.size));
}

Segment::Segment(std::unique_ptr<Memory> memory, uint64_t size)
    : memory_(std::move(memory)), size_(size) {}

Segment::~Segment() { SegmentPool::Global().Give(std::move(memory_)); }

int Segment::fd() const { return memory_->fd.get(); }

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
      if (listener_.valid()) shutdown(listener_.get(), SHUT_RDWR);     // wakes accept
      if (peer_ != nullptr) shutdown(peer_->socket.get(), SHUT_RDWR);  // wakes recvmsg
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
      peer_ = std::make_shared<Peer>(std::move(peer).value());
    }
    thread_ = std::thread([this] { ReadSegments(); });
    return absl::OkStatus();
  }

  const std::string& address() const { return address_; }

  bool connected() const {
    absl::MutexLock lock(&mu_);
    return peer_ != nullptr && !closed_;
  }

  absl::StatusOr<uint64_t> Send(std::shared_ptr<const Segment> segment) {
    absl::MutexLock lock(&send_mu_);
    const uint64_t number = next_number_++;
    DRAY_ASSIGN_OR_RETURN(const int peer, PeerSocket());
    DescriptorMessage message;
    message.words[0] = number;
    message.data.iov_len = sizeof(number);
    cmsghdr* rights = CMSG_FIRSTHDR(&message.header);
    rights->cmsg_level = SOL_SOCKET;
    rights->cmsg_type = SCM_RIGHTS;
    rights->cmsg_len = CMSG_LEN(sizeof(int));
    const int fd = segment->fd();
    std::memcpy(CMSG_DATA(rights), &fd, sizeof(fd));
    if (sendmsg(peer, &message.header, MSG_NOSIGNAL) != sizeof(number)) {
      return Errno("passing a segment");
    }
    absl::MutexLock state(&mu_);
    if (!closed_) in_use_[number] = std::move(segment);  // until the peer lets it go
    return number;
  }

  // PeerSocket: the connection to the peer, once there is one.
  absl::StatusOr<int> PeerSocket() const {
    absl::MutexLock lock(&mu_);
    if (peer_ == nullptr) return absl::FailedPreconditionError("segment passage: no peer yet");
    return peer_->socket.get();
  }

  std::optional<SegmentPassage::Place> Locate(const Bytes& piece) const {
    std::shared_ptr<Peer> peer;
    {
      absl::MutexLock lock(&mu_);
      peer = peer_;
    }
    if (peer == nullptr || piece.empty()) return std::nullopt;
    absl::MutexLock lock(&peer->mu);
    auto mapping = peer->mapped.upper_bound(piece.data());
    if (mapping == peer->mapped.begin()) return std::nullopt;
    --mapping;
    const auto [size, number] = mapping->second;
    const size_t offset = piece.data() - mapping->first;
    if (offset >= size || piece.size() > size - offset) return std::nullopt;
    return SegmentPassage::Place{number, offset};
  }

  absl::StatusOr<uint64_t> HandBack(uint64_t segment) {
    absl::MutexLock lock(&send_mu_);
    const uint64_t number = next_number_++;
    DRAY_ASSIGN_OR_RETURN(const int peer, PeerSocket());
    const uint64_t words[2] = {number, segment};
    if (send(peer, words, sizeof(words), MSG_NOSIGNAL) != sizeof(words)) {
      return Errno("handing a segment back");
    }
    return number;
  }

  absl::StatusOr<Bytes> Receive(uint64_t number, uint64_t size, absl::Duration timeout) {
    Fd segment;
    std::optional<std::shared_ptr<const Segment>> own;  // when handed back
    {
      absl::MutexLock lock(&mu_);
      auto arrived = [this, number]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return closed_ || segments_.count(number) > 0 || handed_back_.count(number) > 0;
      };
      mu_.AwaitWithTimeout(absl::Condition(&arrived), timeout);
      auto back = handed_back_.find(number);
      auto found = segments_.find(number);
      if (back != handed_back_.end()) {
        own = std::move(back->second);
        handed_back_.erase(back);
      } else if (found != segments_.end()) {
        segment = std::move(found->second);
        segments_.erase(found);
      } else {
        return absl::UnavailableError(
            absl::StrCat("segment passage: segment ", number,
                         closed_ ? " never came: the peer went away" : " did not come in time"));
      }
    }
    if (own.has_value()) return MapOwn(number, std::move(*own), size);
    struct stat file = {};
    if (fstat(segment.get(), &file) != 0) return Errno("fstat");
    if (static_cast<uint64_t>(file.st_size) < size ||
        (fcntl(segment.get(), F_GET_SEALS) & kSizeSeals) != kSizeSeals) {
      return absl::InvalidArgumentError(absl::StrCat("segment passage: segment ", number, " has ",
                                                     file.st_size, " sealed bytes, not ", size));
    }
    auto mapping = std::make_shared<Mapping>();
    {
      absl::MutexLock lock(&mu_);
      mapping->sender = peer_;
    }
    mapping->number = number;
    if (size == 0) return Bytes();  // released at once, with `mapping`
    // Mapped lazily: pages that no reader touches (a payload passed on,
    // columns not read) cost nothing.
    void* address = mmap(nullptr, size, PROT_READ, MAP_SHARED, segment.get(), 0);
    if (address == MAP_FAILED) return Errno("mapping a segment");
    mapping->address = address;
    mapping->size = size;
    if (std::shared_ptr<Peer> peer = mapping->sender.lock()) {
      absl::MutexLock lock(&peer->mu);
      peer->mapped[static_cast<const char*>(address)] = {size, number};
    }
    return Bytes::Alias(mapping, absl::string_view(static_cast<const char*>(address), size));
  }

 private:
  // MapOwn maps the first `size` bytes of this end's segment `own`, which
  // the peer handed back under `number`; the mapping keeps it from the pool.
  static absl::StatusOr<Bytes> MapOwn(uint64_t number, std::shared_ptr<const Segment> own,
                                      uint64_t size) {
    if (own == nullptr || own->size() < size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "segment passage: the peer handed back under number ", number,
          own == nullptr ? " a segment this end does not hold"
                         : absl::StrCat(" a segment of ", own->size(), " bytes, not ", size)));
    }
    if (size == 0) return Bytes();
    void* address = mmap(nullptr, size, PROT_READ, MAP_SHARED, own->fd(), 0);
    if (address == MAP_FAILED) return Errno("mapping a handed-back segment");
    auto mapping = std::make_shared<Mapping>();
    mapping->address = address;
    mapping->size = size;
    mapping->own = std::move(own);
    return Bytes::Alias(mapping, absl::string_view(static_cast<const char*>(address), size));
  }

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
        peer_ = std::make_shared<Peer>(std::move(peer));
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

  // ReadSegments files every segment the peer passes, and lets go of each
  // segment the peer is done with, until it goes away.
  void ReadSegments() {
    int peer;
    {
      absl::MutexLock lock(&mu_);
      peer = peer_->socket.get();
    }
    while (true) {
      DescriptorMessage message;
      const ssize_t n = recvmsg(peer, &message.header, MSG_CMSG_CLOEXEC);
      if (n < 0 && errno == EINTR) continue;
      const cmsghdr* rights = n > 0 ? CMSG_FIRSTHDR(&message.header) : nullptr;
      // Without a descriptor, and none dropped by the kernel (this process
      // at its limit), which would make a segment read as a release.
      const bool bare = rights == nullptr && (message.header.msg_flags & MSG_CTRUNC) == 0;
      Fd passed;
      if (rights != nullptr && rights->cmsg_type == SCM_RIGHTS &&
          rights->cmsg_len == CMSG_LEN(sizeof(int))) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(rights), sizeof(fd));
        passed = Fd(fd);
      }
      const uint64_t number = message.words[0];
      std::shared_ptr<const Segment> released;  // let go outside the lock
      absl::MutexLock lock(&mu_);
      if (n == sizeof(number) && passed.valid()) {
        segments_[number] = std::move(passed);
      } else if (n == sizeof(number) && bare) {
        auto found = in_use_.find(number);
        if (found != in_use_.end()) {
          released = std::move(found->second);
          in_use_.erase(found);
        }
      } else if (n == sizeof(message.words) && bare) {
        auto found = in_use_.find(message.words[1]);
        handed_back_[number] = found == in_use_.end() ? nullptr : found->second;
      } else {
        closed_ = true;   // the peer went away (or broke the protocol): its
        in_use_.clear();  // mappings are gone
        handed_back_.clear();
        return;
      }
    }
  }

  const std::string address_;
  const std::string secret_;
  std::thread thread_;  // accepts the peer, then reads its segments
  absl::Mutex send_mu_;
  uint64_t next_number_ ABSL_GUARDED_BY(send_mu_) = 1;
  mutable absl::Mutex mu_;
  Fd listener_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Peer> peer_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, Fd> segments_ ABSL_GUARDED_BY(mu_);  // arrived, not yet received
  // Sent, until the peer lets them go.
  std::map<uint64_t, std::shared_ptr<const Segment>> in_use_ ABSL_GUARDED_BY(mu_);
  // Handed back by the peer, not yet received (null: not held here).
  std::map<uint64_t, std::shared_ptr<const Segment>> handed_back_ ABSL_GUARDED_BY(mu_);
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
absl::StatusOr<uint64_t> SegmentPassage::Send(std::shared_ptr<const Segment> segment) {
  return impl_->Send(std::move(segment));
}
std::optional<SegmentPassage::Place> SegmentPassage::Locate(const Bytes& piece) const {
  return impl_->Locate(piece);
}
absl::StatusOr<uint64_t> SegmentPassage::HandBack(uint64_t segment) {
  return impl_->HandBack(segment);
}
absl::StatusOr<Bytes> SegmentPassage::Receive(uint64_t number, uint64_t size,
                                              absl::Duration timeout) {
  return impl_->Receive(number, size, timeout);
}

}  // namespace dray
