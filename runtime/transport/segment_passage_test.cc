#include "runtime/transport/segment_passage.h"

#include <sys/stat.h>

#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/testing/status_matchers.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::HasSubstr;

// Payload returns `size` bytes as pieces of one repeated 1 MiB buffer, so
// that a payload of gigabytes costs a megabyte here.
ScatteredPayload Payload(uint64_t size) {
  static const Bytes block([] {
    std::string bytes(size_t{1} << 20, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + i / 4096);
    return bytes;
  }());
  ScatteredPayload payload;
  for (uint64_t left = size; left > 0;) {
    const size_t n = std::min<uint64_t>(left, block.size());
    payload.pieces.push_back(block.Part(block.view().substr(0, n)));
    left -= n;
  }
  payload.size = size;
  return payload;
}

// MappedSegments counts this process's mappings of segments.
int MappedSegments() {
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);)
    // Read-only: received (the pool maps its own segments to write).
    count +=
        line.find(" r--s ") != std::string::npos && line.find("dray-payload") != std::string::npos;
  return count;
}

class SegmentPassageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DRAY_ASSERT_OK_AND_ASSIGN(worker_, SegmentPassage::Listen("job secret"));
    DRAY_ASSERT_OK_AND_ASSIGN(controller_,
                              SegmentPassage::Connect(worker_->address(), "job secret"));
  }

  std::unique_ptr<SegmentPassage> worker_, controller_;
};

TEST_F(SegmentPassageTest, PayloadsOfEverySizeArriveWhole) {
  for (uint64_t size : {uint64_t{0}, uint64_t{1}, uint64_t{4096}, uint64_t{5} << 20}) {
    const ScatteredPayload sent = Payload(size);
    DRAY_ASSERT_OK_AND_ASSIGN(uint64_t number, controller_->Send(Segment::Write(sent).value()));
    DRAY_ASSERT_OK_AND_ASSIGN(Bytes received, worker_->Receive(number, size));
    EXPECT_TRUE(received.view() == sent.Flatten()) << size << " bytes";
  }
}

TEST_F(SegmentPassageTest, BothWaysAndOverTwoGibibytes) {
  const uint64_t size = (uint64_t{2} << 30) + 4096 + 1;
  DRAY_ASSERT_OK_AND_ASSIGN(uint64_t number, worker_->Send(Segment::Write(Payload(size)).value()));
  {
    DRAY_ASSERT_OK_AND_ASSIGN(Bytes received, controller_->Receive(number, size));
    ASSERT_EQ(received.size(), size);
    const Bytes block = Payload(1 << 20).pieces[0];
    for (uint64_t at : {uint64_t{0}, (uint64_t{2} << 30) - 1, size - 4097}) {
      const uint64_t offset = at % block.size();
      const size_t n = std::min<uint64_t>(4097, block.size() - offset);
      EXPECT_EQ(received.view().substr(at, n), block.view().substr(offset, n)) << "at " << at;
    }
    EXPECT_EQ(MappedSegments(), 1);
  }
  EXPECT_EQ(MappedSegments(), 0) << "the mapping ends with the last alias";
}

TEST(SharedSegmentTest, OneSegmentReachesEveryReader) {
  SharedSegment shared;
  const ScatteredPayload sent = Payload(3 << 20);
  DRAY_ASSERT_OK_AND_ASSIGN(std::shared_ptr<const Segment> first, shared.Get(sent));
  DRAY_ASSERT_OK_AND_ASSIGN(std::shared_ptr<const Segment> again, shared.Get(sent));
  EXPECT_EQ(first, again) << "written once";
  std::vector<Bytes> received;
  for (int reader = 0; reader < 2; ++reader) {
    DRAY_ASSERT_OK_AND_ASSIGN(auto listening, SegmentPassage::Listen("job secret"));
    DRAY_ASSERT_OK_AND_ASSIGN(auto sending,
                              SegmentPassage::Connect(listening->address(), "job secret"));
    DRAY_ASSERT_OK_AND_ASSIGN(uint64_t number, sending->Send(first));
    DRAY_ASSERT_OK_AND_ASSIGN(Bytes bytes, listening->Receive(number, sent.size));
    received.push_back(std::move(bytes));
  }
  EXPECT_TRUE(received[0].view() == sent.Flatten());
  EXPECT_TRUE(received[1].view() == received[0].view());
}

// Inode names a segment's memory.
ino_t Inode(const Segment& segment) {
  struct stat file = {};
  EXPECT_EQ(fstat(segment.fd(), &file), 0);
  return file.st_ino;
}

TEST_F(SegmentPassageTest, ASegmentIsReusedOnlyOnceItsReaderLetItGo) {
  // A size no other test of this process pools, large enough to be copied
  // in parts whose bounds fall inside pieces.
  const uint64_t size = (uint64_t{9} << 20) + 777;
  std::shared_ptr<const Segment> first = Segment::Write(Payload(size)).value();
  const ino_t first_inode = Inode(*first);
  DRAY_ASSERT_OK_AND_ASSIGN(uint64_t number, controller_->Send(std::move(first)));
  DRAY_ASSERT_OK_AND_ASSIGN(Bytes held, worker_->Receive(number, size));
  std::shared_ptr<const Segment> second = Segment::Write(Payload(size)).value();
  EXPECT_NE(Inode(*second), first_inode) << "the first is still mapped";
  held = Bytes();  // the worker lets the first go...
  // ...and says so before this segment, which the controller thus receives after.
  DRAY_ASSERT_OK_AND_ASSIGN(uint64_t back, worker_->Send(Segment::Write(Payload(1)).value()));
  DRAY_ASSERT_OK(controller_->Receive(back, 1).status());
  std::shared_ptr<const Segment> third = Segment::Write(Payload(size)).value();
  EXPECT_EQ(Inode(*third), first_inode) << "its pages are reused";
  DRAY_ASSERT_OK_AND_ASSIGN(number, controller_->Send(std::move(third)));
  DRAY_ASSERT_OK_AND_ASSIGN(Bytes received, worker_->Receive(number, size));
  EXPECT_TRUE(received.view() == Payload(size).Flatten());
}

TEST_F(SegmentPassageTest, ASegmentSmallerThanAnnouncedIsRefused) {
  // A pooled segment may be larger than its payload, never twice as large.
  DRAY_ASSERT_OK_AND_ASSIGN(uint64_t number,
                            controller_->Send(Segment::Write(Payload(12345)).value()));
  EXPECT_THAT(worker_->Receive(number, 2 * 12345 + 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sealed bytes, not 24691")));
}

TEST_F(SegmentPassageTest, APeerThatGoesAwayFailsWhatWaitsForIt) {
  controller_.reset();
  EXPECT_THAT(worker_->Receive(1, 1),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("the peer went away")));
}

TEST(SegmentPassageHandshakeTest, OnlyThePeerWithTheSecretIsAccepted) {
  DRAY_ASSERT_OK_AND_ASSIGN(auto worker, SegmentPassage::Listen("job secret"));
  DRAY_ASSERT_OK_AND_ASSIGN(auto stranger, SegmentPassage::Connect(worker->address(), "guess"));
  EXPECT_THAT(stranger->Receive(1, 1),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("the peer went away")));
  EXPECT_FALSE(worker->connected());
  EXPECT_THAT(worker->Send(Segment::Write(Payload(1)).value()),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  DRAY_ASSERT_OK_AND_ASSIGN(auto controller,
                            SegmentPassage::Connect(worker->address(), "job secret"));
  DRAY_ASSERT_OK_AND_ASSIGN(uint64_t number, controller->Send(Segment::Write(Payload(3)).value()));
  DRAY_ASSERT_OK_AND_ASSIGN(Bytes received, worker->Receive(number, 3));
  EXPECT_EQ(received.size(), 3u);
}

}  // namespace
}  // namespace dray
