// SocketSession: a Session (session_stream.h) between a controller and a
// worker of one node over a unix stream socket, without gRPC: the same
// frames, each sent as its length (4 bytes, little-endian) and its bytes,
// and at the end how the worker ended the session. No HTTP/2, no
// completion queue, no thread between a frame and the socket: a small call
// costs a write on one side and a read on the other, and frames that arrive
// together are read with one system call.
//
// The worker's SessionListener takes sessions on an abstract socket
// (abstract_socket.h) from peers that show the job secret; the controller's
// Connect shows it and learns at once whether it was accepted.
//
//   // worker:
//   DRAY_ASSIGN_OR_RETURN(auto listener, SessionListener::Listen(secret,
//       [&](std::unique_ptr<SocketSession> session, bool shared_memory) {
//         session->End(Serve(session.get()));   // runs on a thread of its own
//       }));
//   register(listener->address());
//   // controller, on the same node:
//   DRAY_ASSIGN_OR_RETURN(auto session, SocketSession::Connect(address, secret, true));
//   WriteCallRequest(session.get(), ...);  ReadCallResponse(session.get());
//
// Writes never wait on the peer: what the socket cannot take at once waits
// in a queue that a thread of the session sends as the peer reads.
//
// Thread-safety: as ClientSession: one thread reads, writers are serialized
// by the caller; Cancel and End from any thread.
#ifndef DRAY_RUNTIME_TRANSPORT_SOCKET_SESSION_H_
#define DRAY_RUNTIME_TRANSPORT_SOCKET_SESSION_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/rpc/session_stream.h"
#include "runtime/transport/abstract_socket.h"

namespace dray {

class SocketSession final : public ClientSession {
 public:
  // Connect opens a session with the SessionListener at `address`
  // (unix-abstract:NAME), showing `job_secret`; `shared_memory` tells the
  // worker that this side holds its SegmentPassage. UNAUTHENTICATED when the
  // worker refuses the secret, UNAVAILABLE when it cannot be reached.
  static absl::StatusOr<std::unique_ptr<SocketSession>> Connect(const std::string& address,
                                                                const std::string& job_secret,
                                                                bool shared_memory);
  explicit SocketSession(Fd socket);
  ~SocketSession() override;
  SocketSession(const SocketSession&) = delete;
  SocketSession& operator=(const SocketSession&) = delete;

  bool Read(grpc::ByteBuffer* frame) override;
  bool Write(const grpc::ByteBuffer& frame) override;
  void Cancel() override;
  absl::Status Finish() override;

  // End (the worker's side) sends how the session ended, after every frame
  // written before; nothing is written after it. (In the handshake, OK
  // accepts the session.)
  void End(const absl::Status& status);

 private:
  friend class SessionListener;

  // Send writes `slices` now as far as the socket takes them, and queues
  // the rest; false once the socket broke.
  bool Send(std::vector<grpc::Slice> slices);
  // SendQueued sends the queue as the peer reads (the sender thread).
  void SendQueued();
  // Fill reads what the socket has (at least one byte) into the buffer.
  bool Fill();
  // ReadExact copies the next `size` bytes to `out`.
  bool ReadExact(void* out, size_t size);
  // ReadEnd reads the status that ends the session.
  void ReadEnd();

  const Fd socket_;

  // The reading thread's buffer: bytes [start_, end_) are read, not taken.
  std::vector<char> buffer_;
  size_t start_ = 0, end_ = 0;
  std::optional<absl::Status> ended_;  // how the peer ended the session

  absl::Mutex mu_;
  std::deque<grpc::Slice> queued_ ABSL_GUARDED_BY(mu_);  // front: partly sent
  size_t queued_offset_ ABSL_GUARDED_BY(mu_) = 0;        // sent bytes of the front
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread sender_;  // started when a frame first has to wait
};

// SessionListener: where a worker takes SocketSessions from its node.
class SessionListener {
 public:
  // SessionHandler serves one session, on a thread of its own; it ends the
  // session (End) when done. `shared_memory`: the peer holds the worker's
  // SegmentPassage.
  using SessionHandler =
      std::function<void(std::unique_ptr<SocketSession> session, bool shared_memory)>;

  // Listen takes sessions from peers that show `job_secret` (others get
  // UNAUTHENTICATED), each handed to `handler`.
  static absl::StatusOr<std::unique_ptr<SessionListener>> Listen(std::string job_secret,
                                                                 SessionHandler handler);
  // Stops taking sessions; those running go on.
  ~SessionListener();
  SessionListener(const SessionListener&) = delete;
  SessionListener& operator=(const SessionListener&) = delete;

  // address: unix-abstract:NAME, for Connect.
  const std::string& address() const { return address_; }

 private:
  SessionListener(std::string address, Fd listener, std::string job_secret, SessionHandler handler);
  void Accept();
  // Serve takes the handshake of `peer` and, if it shows `secret`, hands
  // the session to `handler`.
  static void Serve(const std::string& secret, const SessionHandler& handler, Fd peer);

  const std::string address_;
  const Fd listener_;
  const std::string job_secret_;
  const SessionHandler handler_;
  std::thread acceptor_;
};

}  // namespace dray

#endif  // DRAY_RUNTIME_TRANSPORT_SOCKET_SESSION_H_
