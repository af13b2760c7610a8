#include "runtime/transport/socket_session.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "dray/v1/worker.pb.h"
#include "runtime/security/job_secret.h"

namespace dray {
namespace {

// A frame's length is 4 bytes in the host's order (both ends share it);
// kEndMark instead announces the status that ends the session: its length
// and a serialized CallError follow.
constexpr uint32_t kEndMark = 0xFFFFFFFF;
constexpr uint32_t kMaxFrameBytes = uint32_t{1} << 30;
constexpr uint32_t kMaxHelloBytes = 4096;
constexpr uint32_t kMaxEndBytes = uint32_t{1} << 20;  // a status and its message
constexpr size_t kReadBufferBytes = size_t{256} << 10;
constexpr size_t kMaxSlicesPerSend = 64;
constexpr absl::Duration kHandshakeTimeout = absl::Seconds(10);
constexpr char kAddressScheme[] = "unix-abstract:";

grpc::Slice Word(uint32_t value) { return grpc::Slice(&value, sizeof(value)); }

// SetReadTimeout makes reads of `socket` fail after `timeout` (none: zero).
void SetReadTimeout(int socket, absl::Duration timeout) {
  const timeval limit = absl::ToTimeval(timeout);
  setsockopt(socket, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
}

// SendSlices sends what the socket takes at once of `slices`, the first
// `offset` bytes of the first one already sent; the count, or -1 (errno).
ssize_t SendSlices(int socket, const grpc::Slice* slices, size_t count, size_t offset) {
  iovec pieces[kMaxSlicesPerSend];
  const size_t n = std::min(count, kMaxSlicesPerSend);
  for (size_t i = 0; i < n; ++i) {
    const size_t skip = i == 0 ? offset : 0;
    pieces[i] = {const_cast<uint8_t*>(slices[i].begin()) + skip, slices[i].size() - skip};
  }
  msghdr message = {};
  message.msg_iov = pieces;
  message.msg_iovlen = n;
  ssize_t sent;
  do {
    sent = sendmsg(socket, &message, MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  return sent;
}

// Advance moves (`first`, `offset`) past `sent` more bytes of `slices`
// (`count` of them), and past any empty slice.
void Advance(const grpc::Slice* slices, size_t count, size_t sent, size_t* first, size_t* offset) {
  for (; *first < count; ++*first, *offset = 0) {
    const size_t left = slices[*first].size() - *offset;
    if (left > sent) {
      *offset += sent;
      return;
    }
    sent -= left;
  }
}

}  // namespace

SocketSession::SocketSession(Fd socket) : socket_(std::move(socket)), buffer_(kReadBufferBytes) {}

SocketSession::~SocketSession() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;  // the sender sends what is queued, then returns
  }
  if (sender_.joinable()) sender_.join();
}

absl::StatusOr<std::unique_ptr<SocketSession>> SocketSession::Connect(const std::string& address,
                                                                      const std::string& job_secret,
                                                                      bool shared_memory) {
  absl::string_view name = address;
  if (!absl::ConsumePrefix(&name, kAddressScheme)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a session socket's address is unix-abstract:NAME, not '", address, "'"));
  }
  DRAY_ASSIGN_OR_RETURN(Fd socket, ConnectAbstract(std::string(name), SOCK_STREAM));
  SetReadTimeout(socket.get(), kHandshakeTimeout);
  auto session = std::make_unique<SocketSession>(std::move(socket));
  const grpc::Slice hello(absl::StrCat(job_secret, shared_memory ? "1" : "0"));
  grpc::ByteBuffer frame;
  if (!session->Write(grpc::ByteBuffer(&hello, 1)) || session->Read(&frame) ||
      !session->ended_.has_value()) {
    return absl::UnavailableError(
        absl::StrCat("the worker at ", address, " did not answer the session's handshake"));
  }
  if (!session->ended_->ok()) {
    return absl::Status(session->ended_->code(),
                        absl::StrCat("the worker at ", address,
                                     " refused the session: ", session->ended_->message()));
  }
  session->ended_.reset();  // accepted
  SetReadTimeout(session->socket_.get(), absl::ZeroDuration());
  return session;
}

bool SocketSession::Read(grpc::ByteBuffer* frame) {
  uint32_t length = 0;
  if (ended_.has_value() || !ReadExact(&length, sizeof(length))) return false;
  if (length == kEndMark) {
    ReadEnd();
    return false;
  }
  if (length > kMaxFrameBytes) {
    ended_ = absl::InvalidArgumentError(
        absl::StrCat("session: a frame announces ", length, " bytes, over the limit"));
    return false;
  }
  grpc::Slice bytes(length);
  if (!ReadExact(const_cast<uint8_t*>(bytes.begin()), length)) return false;
  *frame = grpc::ByteBuffer(&bytes, 1);
  return true;
}

void SocketSession::ReadEnd() {
  uint32_t length = 0;
  std::string bytes;
  v1::CallError error;
  if (ReadExact(&length, sizeof(length)) && length <= kMaxEndBytes) {
    bytes.resize(length);
    if (ReadExact(bytes.data(), length) && error.ParseFromString(bytes)) {
      ended_ = absl::Status(static_cast<absl::StatusCode>(error.code()), error.message());
      return;
    }
  }
  ended_ = absl::UnavailableError("session: the peer broke off while ending the session");
}

bool SocketSession::Fill() {
  if (start_ == end_) start_ = end_ = 0;
  if (end_ == buffer_.size()) {  // make room: move what is left to the front
    std::memmove(buffer_.data(), buffer_.data() + start_, end_ - start_);
    end_ -= start_;
    start_ = 0;
  }
  ssize_t n;
  do {
    n = recv(socket_.get(), buffer_.data() + end_, buffer_.size() - end_, 0);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  end_ += static_cast<size_t>(n);
  return true;
}

bool SocketSession::ReadExact(void* out, size_t size) {
  char* to = static_cast<char*>(out);
  while (size > 0) {
    if (start_ < end_) {
      const size_t n = std::min(size, end_ - start_);
      std::memcpy(to, buffer_.data() + start_, n);
      start_ += n;
      to += n;
      size -= n;
    } else if (size >= buffer_.size()) {  // large: straight to its place
      const ssize_t n = recv(socket_.get(), to, size, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      to += n;
      size -= static_cast<size_t>(n);
    } else if (!Fill()) {
      return false;
    }
  }
  return true;
}

bool SocketSession::Write(const grpc::ByteBuffer& frame) {
  std::vector<grpc::Slice> slices;
  if (frame.Length() >= kMaxFrameBytes || !frame.Dump(&slices).ok()) return false;
  slices.insert(slices.begin(), Word(static_cast<uint32_t>(frame.Length())));
  return Send(std::move(slices));
}

void SocketSession::End(const absl::Status& status) {
  v1::CallError error;
  error.set_code(static_cast<int32_t>(status.code()));
  error.set_message(std::string(status.message()));
  const std::string bytes = error.SerializeAsString();
  Send({Word(kEndMark), Word(static_cast<uint32_t>(bytes.size())), grpc::Slice(bytes)});
}

bool SocketSession::Send(std::vector<grpc::Slice> slices) {
  absl::MutexLock lock(&mu_);
  if (broken_) return false;
  size_t first = 0, offset = 0;
  if (queued_.empty()) {  // nothing ahead of it: straight to the socket
    const ssize_t sent = SendSlices(socket_.get(), slices.data(), slices.size(), 0);
    if (sent < 0 && errno != EAGAIN) {
      broken_ = true;
      return false;
    }
    Advance(slices.data(), slices.size(), std::max<ssize_t>(sent, 0), &first, &offset);
    if (first == slices.size()) return true;
    queued_offset_ = offset;
  }
  queued_.insert(queued_.end(), std::make_move_iterator(slices.begin() + first),
                 std::make_move_iterator(slices.end()));
  if (!sender_.joinable()) sender_ = std::thread([this] { SendQueued(); });
  return true;
}

void SocketSession::SendQueued() {
  absl::MutexLock lock(&mu_);
  auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !queued_.empty() || stopping_ || broken_;
  };
  while (true) {
    mu_.Await(absl::Condition(&work));
    if (queued_.empty() || broken_) return;
    // Writers only append while the queue is not empty: its front is ours.
    const std::vector<grpc::Slice> batch(
        queued_.begin(), queued_.begin() + std::min(queued_.size(), kMaxSlicesPerSend));
    const size_t offset = queued_offset_;
    mu_.Unlock();
    pollfd writable = {socket_.get(), POLLOUT, 0};
    poll(&writable, 1, -1);
    const ssize_t sent = SendSlices(socket_.get(), batch.data(), batch.size(), offset);
    const int error = errno;
    mu_.Lock();
    if (sent < 0 && error != EAGAIN) {
      broken_ = true;
      queued_.clear();
      return;
    }
    size_t first = 0, next_offset = offset;
    Advance(batch.data(), batch.size(), std::max<ssize_t>(sent, 0), &first, &next_offset);
    queued_.erase(queued_.begin(), queued_.begin() + first);
    queued_offset_ = next_offset;
  }
}

void SocketSession::Cancel() {
  shutdown(socket_.get(), SHUT_RDWR);  // wakes a pending read, and a waiting send
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
}

absl::Status SocketSession::Finish() {
  if (ended_.has_value()) return *ended_;
  absl::MutexLock lock(&mu_);
  if (cancelled_) return absl::CancelledError("session: cancelled");
  return absl::UnavailableError("session: the connection closed");
}

SessionListener::SessionListener(std::string address, Fd listener, std::string job_secret,
                                 SessionHandler handler)
    : address_(std::move(address)),
      listener_(std::move(listener)),
      job_secret_(std::move(job_secret)),
      handler_(std::move(handler)) {}

absl::StatusOr<std::unique_ptr<SessionListener>> SessionListener::Listen(std::string job_secret,
                                                                         SessionHandler handler) {
  const std::string name = NewAbstractName("dray-worker");
  DRAY_ASSIGN_OR_RETURN(Fd listener, ListenAbstract(name, SOCK_STREAM));
  std::unique_ptr<SessionListener> sessions(
      new SessionListener(absl::StrCat(kAddressScheme, name), std::move(listener),
                          std::move(job_secret), std::move(handler)));
  sessions->acceptor_ = std::thread([listener = sessions.get()] { listener->Accept(); });
  return sessions;
}

SessionListener::~SessionListener() {
  shutdown(listener_.get(), SHUT_RDWR);  // wakes accept
  acceptor_.join();
}

void SessionListener::Accept() {
  while (true) {
    Fd peer(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!peer.valid()) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down
    }
    // The handshake waits on the peer: on the session's own thread.
    std::thread(&SessionListener::Serve, job_secret_, handler_, std::move(peer)).detach();
  }
}

void SessionListener::Serve(const std::string& secret, const SessionHandler& handler, Fd peer) {
  SetReadTimeout(peer.get(), kHandshakeTimeout);
  auto session = std::make_unique<SocketSession>(std::move(peer));
  uint32_t length = 0;
  std::string hello;
  if (!session->ReadExact(&length, sizeof(length)) || length == 0 || length > kMaxHelloBytes) {
    return;
  }
  hello.resize(length);
  if (!session->ReadExact(hello.data(), length)) return;
  if (!ShowsSecret(absl::string_view(hello).substr(0, length - 1), secret)) {
    session->End(absl::UnauthenticatedError("this session does not carry the job's secret"));
    return;
  }
  SetReadTimeout(session->socket_.get(), absl::ZeroDuration());
  session->End(absl::OkStatus());  // accepted: the session goes on
  handler(std::move(session), hello.back() == '1');
}

}  // namespace dray
