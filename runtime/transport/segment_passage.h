// SegmentPassage: large payloads between a controller and a worker of one
// node through shared memory instead of the Session stream.
//
// The sender copies a payload once into a memfd (an anonymous shared-memory
// file) whose size is sealed, and passes its descriptor over a unix socket
// (SCM_RIGHTS) under a number; the Session frame names only the number, as
// an extent (DataProto.shared_extents). The receiver maps the file
// read-only and decodes in place: its tensors alias the mapping. When the
// mapping's last alias goes, the receiver tells the sender, whose process
// keeps the segment in a pool and copies a later payload into the same
// pages (a fresh segment's pages cost as much as the copy). The kernel frees
// a segment when its last descriptor and mapping are gone, so nothing
// outlives the processes, whichever dies and however (SIGKILL included), and
// no file in /dev/shm ever names a segment.
//
// A payload may also lie partly in segments the receiver itself passed (a
// result that carries rows of its input): the sender then hands those back
// by number instead of copying them (HandBack), and the receiver maps its
// own pages.
//
// The socket is abstract (no file, gone with the process); any process of
// the node can connect to it, so the connecting side must show the job
// secret first, and only one peer is ever accepted.
//
//   // worker:
//   DRAY_ASSIGN_OR_RETURN(auto passage, SegmentPassage::Listen(job_secret));
//   register(passage->address());
//   // controller, on the same node:
//   DRAY_ASSIGN_OR_RETURN(auto passage, SegmentPassage::Connect(address, job_secret));
//   DRAY_ASSIGN_OR_RETURN(auto segment, Segment::Write(payload));
//   DRAY_ASSIGN_OR_RETURN(uint64_t number, passage->Send(segment));  // name it in the frame
//   // worker, on reading the frame:
//   DRAY_ASSIGN_OR_RETURN(Bytes payload, passage->Receive(number, size));
//
// Thread-safety: thread-safe.
#ifndef DRAY_RUNTIME_TRANSPORT_SEGMENT_PASSAGE_H_
#define DRAY_RUNTIME_TRANSPORT_SEGMENT_PASSAGE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dispatch/data_proto.h"
#include "dispatch/wire.h"
#include "runtime/transport/abstract_socket.h"

namespace dray {

// Payloads of at least this size take the passage where there is one.
inline constexpr uint64_t kSharedPayloadBytes = uint64_t{256} << 10;

// Segment: a payload written once into shared memory (a memfd), which any
// number of passages may pass on: every receiver maps the same pages. It
// goes back to the process's pool when the last passage's peer let it go.
class Segment {
 public:
  // Write copies `payload` into a pooled segment that fits, else a new one.
  static absl::StatusOr<std::shared_ptr<const Segment>> Write(const ScatteredPayload& payload);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  int fd() const;
  uint64_t size() const { return size_; }

  // Memory: a memfd of `capacity` bytes, and its writable mapping once it
  // was reused.
  struct Memory {
    ~Memory();
    Fd fd;
    uint64_t capacity = 0;
    void* writable = nullptr;
  };

 private:
  Segment(std::unique_ptr<Memory> memory, uint64_t size);
  std::unique_ptr<Memory> memory_;
  const uint64_t size_;
};

// SharedSegment: one payload's segment, written by the first sender that
// needs it and reused by every later one, so that a payload bound for
// several workers of the node (a broadcast's input) is copied once.
class SharedSegment {
 public:
  absl::StatusOr<std::shared_ptr<const Segment>> Get(const ScatteredPayload& payload);

 private:
  absl::Mutex mu_;
  std::shared_ptr<const Segment> segment_ ABSL_GUARDED_BY(mu_);
};

class SegmentPassage {
 public:
  // Listen opens an abstract socket for the one peer that will show
  // `job_secret`; until it has connected, Send fails FAILED_PRECONDITION.
  static absl::StatusOr<std::unique_ptr<SegmentPassage>> Listen(std::string job_secret);
  // Connect reaches a Listen()ing process's `address` and shows `job_secret`.
  static absl::StatusOr<std::unique_ptr<SegmentPassage>> Connect(const std::string& address,
                                                                 const std::string& job_secret);
  ~SegmentPassage();
  SegmentPassage(const SegmentPassage&) = delete;
  SegmentPassage& operator=(const SegmentPassage&) = delete;

  // address: where Connect reaches this end (its abstract name, for Listen).
  const std::string& address() const;

  // connected: whether a peer is there to Send to.
  bool connected() const;

  // Send passes `segment` to the peer and returns the number it goes by;
  // the passage holds the segment until the peer lets it go.
  absl::StatusOr<uint64_t> Send(std::shared_ptr<const Segment> segment);

  // Place: where bytes lie in a segment the peer passed: the peer's number
  // for it and the offset.
  struct Place {
    uint64_t segment;
    uint64_t offset;
  };
  // Locate says where `piece` lies if it lies within a segment received
  // from the peer (a row of a received input, say), else nullopt.
  std::optional<Place> Locate(const Bytes& piece) const;

  // HandBack passes the peer's own `segment` (see Locate) back to it, and
  // returns the number it goes by: the peer's Receive maps its own pages,
  // and keeps them from its pool until that mapping is gone.
  // FAILED_PRECONDITION before a peer connected.
  absl::StatusOr<uint64_t> HandBack(uint64_t segment);

  // Receive waits up to `timeout` for the peer's segment `number` (one it
  // wrote, or one of this end's that it handed back) and maps its first
  // `size` bytes; the result keeps the mapping alive, and the peer hears
  // when it is gone. UNAVAILABLE when the peer went away, INVALID_ARGUMENT
  // for a segment that is smaller than `size` or whose size is not sealed.
  absl::StatusOr<Bytes> Receive(uint64_t number, uint64_t size,
                                absl::Duration timeout = absl::Seconds(30));

 private:
  class Impl;
  explicit SegmentPassage(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dray

#endif  // DRAY_RUNTIME_TRANSPORT_SEGMENT_PASSAGE_H_
