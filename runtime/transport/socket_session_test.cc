#include "runtime/transport/socket_session.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/testing/status_matchers.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kSecret[] = "the job's secret";

grpc::ByteBuffer Frame(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string Bytes(const grpc::ByteBuffer& frame) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(frame.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes;
}

// Pattern returns `size` bytes that differ with `seed`.
std::string Pattern(size_t size, int seed) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 31 + seed + i / 4096);
  return bytes;
}

// EchoUntilAskedToEnd sends every frame back until one says "end", then
// ends the session with FAILED_PRECONDITION (so the status is seen to travel).
void EchoUntilAskedToEnd(std::unique_ptr<SocketSession> session, bool) {
  grpc::ByteBuffer frame;
  while (session->Read(&frame)) {
    if (Bytes(frame) == "end") {
      session->End(absl::FailedPreconditionError("asked to end"));
      return;
    }
    session->Write(frame);
  }
  session->End(absl::OkStatus());
}

TEST(SocketSessionTest, FramesOfEverySizeGoBothWaysInOrderAndTheEndSaysWhy) {
  DRAY_ASSERT_OK_AND_ASSIGN(auto listener, SessionListener::Listen(kSecret, EchoUntilAskedToEnd));
  EXPECT_THAT(listener->address(), ::testing::StartsWith("unix-abstract:dray-worker-"));
  DRAY_ASSERT_OK_AND_ASSIGN(auto session,
                            SocketSession::Connect(listener->address(), kSecret, false));
  std::vector<std::string> sent = {"", "x", Pattern(4096, 1), Pattern(5 << 20, 2)};
  for (int i = 0; i < 1000; ++i) sent.push_back(absl::StrCat("call ", i));
  for (const std::string& bytes : sent) ASSERT_TRUE(session->Write(Frame(bytes)));
  ASSERT_TRUE(session->Write(Frame("end")));
  for (const std::string& bytes : sent) {
    grpc::ByteBuffer frame;
    ASSERT_TRUE(session->Read(&frame));
    ASSERT_EQ(Bytes(frame), bytes);
  }
  grpc::ByteBuffer frame;
  EXPECT_FALSE(session->Read(&frame));
  EXPECT_THAT(session->Finish(), StatusIs(absl::StatusCode::kFailedPrecondition, "asked to end"));
}

TEST(SocketSessionTest, WritesNeverWaitOnAPeerThatDoesNotRead) {
  // Handlers outlive the test's frame: they share what they wait on.
  auto read_now = std::make_shared<absl::Notification>();
  DRAY_ASSERT_OK_AND_ASSIGN(
      auto listener,
      SessionListener::Listen(
          kSecret, [read_now](std::unique_ptr<SocketSession> session, bool shared_memory) {
            read_now->WaitForNotification();
            EchoUntilAskedToEnd(std::move(session), shared_memory);
          }));
  DRAY_ASSERT_OK_AND_ASSIGN(auto session,
                            SocketSession::Connect(listener->address(), kSecret, true));
  // Far more than a socket holds: the writes queue, and return at once.
  for (int i = 0; i < 64; ++i) ASSERT_TRUE(session->Write(Frame(Pattern(1 << 20, i))));
  ASSERT_TRUE(session->Write(Frame("end")));
  read_now->Notify();
  for (int i = 0; i < 64; ++i) {
    grpc::ByteBuffer frame;
    ASSERT_TRUE(session->Read(&frame));
    ASSERT_EQ(Bytes(frame), Pattern(1 << 20, i)) << "frame " << i;
  }
}

TEST(SocketSessionTest, TheSharedMemoryFlagReachesTheHandler) {
  for (bool shared_memory : {false, true}) {
    auto seen = std::make_shared<std::atomic<int>>(-1);
    DRAY_ASSERT_OK_AND_ASSIGN(
        auto listener,
        SessionListener::Listen(kSecret, [seen](std::unique_ptr<SocketSession> session, bool flag) {
          *seen = flag;
          session->End(absl::FailedPreconditionError("seen"));
        }));
    DRAY_ASSERT_OK_AND_ASSIGN(auto session,
                              SocketSession::Connect(listener->address(), kSecret, shared_memory));
    grpc::ByteBuffer frame;
    EXPECT_FALSE(session->Read(&frame));  // the handler ended it: it has run
    EXPECT_EQ(*seen, shared_memory ? 1 : 0);
  }
}

TEST(SocketSessionTest, APeerWithoutTheSecretIsRefused) {
  auto handled = std::make_shared<std::atomic<bool>>(false);
  DRAY_ASSERT_OK_AND_ASSIGN(auto listener,
                            SessionListener::Listen(kSecret, [handled](auto session, bool) {
                              *handled = true;
                              session->End(absl::OkStatus());
                            }));
  for (const std::string& guess :
       {std::string(), std::string("a guess"), std::string(kSecret) + "!"}) {
    EXPECT_THAT(SocketSession::Connect(listener->address(), guess, false),
                StatusIs(absl::StatusCode::kUnauthenticated,
                         HasSubstr("refused the session: this session does not carry the job's "
                                   "secret")));
  }
  EXPECT_FALSE(*handled);
}

TEST(SocketSessionTest, CancelWakesAPendingRead) {
  auto done = std::make_shared<absl::Notification>();
  DRAY_ASSERT_OK_AND_ASSIGN(auto listener,
                            SessionListener::Listen(kSecret, [done](auto session, bool) {
                              done->WaitForNotification();  // never writes
                            }));
  DRAY_ASSERT_OK_AND_ASSIGN(auto session,
                            SocketSession::Connect(listener->address(), kSecret, false));
  std::thread reader([&] {
    grpc::ByteBuffer frame;
    EXPECT_FALSE(session->Read(&frame));
  });
  session->Cancel();
  reader.join();
  EXPECT_THAT(session->Finish(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_FALSE(session->Write(Frame("late")));
  done->Notify();
}

TEST(SocketSessionTest, APeerThatGoesAwayEndsReads) {
  DRAY_ASSERT_OK_AND_ASSIGN(auto listener, SessionListener::Listen(kSecret, [](auto session, bool) {
                              session.reset();  // gone without a word
                            }));
  DRAY_ASSERT_OK_AND_ASSIGN(auto session,
                            SocketSession::Connect(listener->address(), kSecret, false));
  grpc::ByteBuffer frame;
  EXPECT_FALSE(session->Read(&frame));
  EXPECT_THAT(session->Finish(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("connection closed")));
}

TEST(SocketSessionTest, AddressesAreChecked) {
  EXPECT_THAT(SocketSession::Connect("127.0.0.1:80", kSecret, false),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unix-abstract:NAME")));
  EXPECT_THAT(SocketSession::Connect("unix-abstract:dray-nobody-listens", kSecret, false),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("dray-nobody-listens")));
}

}  // namespace
}  // namespace dray
