// Unit tests of the Session framing, over an in-memory frame queue. The real
// gRPC transport is exercised by tests/runtime/worker_group_test.
#include "runtime/rpc/session_stream.h"

#include <ATen/ops/arange.h>

#include <deque>
#include <string>
#include <vector>

#include "base/testing/status_matchers.h"
#include "dispatch/payload_stream.h"
#include "dispatch/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::HasSubstr;

// FrameQueue: one end of a fake stream that reads back, in order, the frames
// written to it.
class FrameQueue final : public SessionReader, public SessionWriter {
 public:
  bool Write(const grpc::ByteBuffer& frame) override {
    frames.push_back(frame);
    return true;
  }
  bool Read(grpc::ByteBuffer* frame) override {
    if (frames.empty()) return false;
    *frame = frames.front();
    frames.pop_front();
    return true;
  }

  std::deque<grpc::ByteBuffer> frames;
};

// Pieces returns the bytes of `frame` as they lie in its slices.
std::vector<std::string> Pieces(const grpc::ByteBuffer& frame) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(frame.Dump(&slices).ok());
  std::vector<std::string> pieces;
  for (const grpc::Slice& slice : slices) {
    pieces.emplace_back(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return pieces;
}

std::string BytesOf(const grpc::ByteBuffer& frame) {
  std::string bytes;
  for (const std::string& piece : Pieces(frame)) bytes += piece;
  return bytes;
}

// Frame builds a frame from `bytes`, cut into slices at `cuts`.
grpc::ByteBuffer Frame(const std::string& bytes, std::vector<size_t> cuts = {}) {
  std::vector<grpc::Slice> slices;
  size_t start = 0;
  cuts.push_back(bytes.size());
  for (size_t cut : cuts) {
    slices.emplace_back(bytes.data() + start, cut - start);
    start = cut;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string ChunkFrameBytes(const std::string& chunk) {
  v1::CallRequestFrame frame;
  frame.set_payload_chunk(chunk);
  return frame.SerializeAsString();
}

std::string HeaderFrameBytes(const v1::CallRequest& request) {
  v1::CallRequestFrame frame;
  *frame.mutable_header() = request;
  return frame.SerializeAsString();
}

v1::CallRequestFrame Parsed(const grpc::ByteBuffer& frame) {
  v1::CallRequestFrame parsed;
  EXPECT_TRUE(parsed.ParseFromString(BytesOf(frame)));
  return parsed;
}

// Request returns a call of "echo" carrying `batch` (payload detached into *payload).
v1::CallRequest Request(const DataProto& batch, ScatteredPayload* payload) {
  DetachedWire wire = ToDetachedWire(batch).value();
  v1::CallRequest request;
  request.set_method("echo");
  request.set_call_id(7);
  *request.mutable_input() = std::move(wire.header);
  *payload = std::move(wire.payload);
  return request;
}

DataProto ImageBatch(size_t image_bytes, std::string fills = "ab") {
  std::vector<Image> images;
  for (char fill : fills) {
    images.push_back({Image::Format::kPng, 0, 0, 0, Bytes(std::string(image_bytes, fill))});
  }
  return DataProto::Make({{"x", at::arange(2, at::kLong)}}, {{"images", std::move(images)}})
      .value();
}

// ReadInput decodes the next call's input from `queue`.
DataProto ReadInput(FrameQueue* queue, SegmentPassage* segments = nullptr) {
  absl::StatusOr<std::optional<Received<v1::CallRequest>>> request =
      ReadCallRequest(queue, segments);
  EXPECT_TRUE(request.ok()) << request.status();
  EXPECT_TRUE(request->has_value());
  EXPECT_EQ((*request)->header.call_id(), 7u);
  return FromWire((*request)->header.input(), (*request)->payload).value();
}

TEST(SessionStreamTest, SmallCallsTravelInOneFrame) {
  ScatteredPayload payload;
  const DataProto batch = ImageBatch(100);
  FrameQueue queue;
  ASSERT_TRUE(WriteCallRequest(&queue, Request(batch, &payload), payload));
  ASSERT_EQ(queue.frames.size(), 1u);
  const v1::DataProto input = Parsed(queue.frames.front()).header().input();
  EXPECT_EQ(input.payload().size(), input.payload_size());
  EXPECT_EQ(input.payload(), ToWire(batch).value().payload());

  const DataProto received = ReadInput(&queue);
  EXPECT_EQ(*received.GetRows<Image>("images").value(), *batch.GetRows<Image>("images").value());
  DRAY_ASSERT_OK_AND_ASSIGN(std::optional<Received<v1::CallRequest>> end, ReadCallRequest(&queue));
  EXPECT_FALSE(end.has_value());  // the stream ended between messages
}

TEST(SessionStreamTest, LargePayloadsFollowAsChunksBuiltAroundTheirRows) {
  ScatteredPayload payload;
  const DataProto batch = ImageBatch(size_t{3} << 20);  // 6 MiB in two rows
  FrameQueue queue;
  ASSERT_TRUE(WriteCallRequest(&queue, Request(batch, &payload), payload));
  ASSERT_EQ(queue.frames.size(), 5u);  // header, 3 chunks of 2 MiB, one of the bytes left

  // Plain protobuf reads every frame: a detached header, then chunks.
  const v1::DataProto header = Parsed(queue.frames[0]).header().input();
  EXPECT_TRUE(header.payload().empty());
  std::string chunks;
  for (size_t i = 1; i < queue.frames.size(); ++i) {
    const v1::CallRequestFrame chunk = Parsed(queue.frames[i]);
    ASSERT_EQ(chunk.frame_case(), v1::CallRequestFrame::kPayloadChunk);
    EXPECT_LE(chunk.payload_chunk().size(), kDefaultChunkBytes);
    chunks += chunk.payload_chunk();
  }
  EXPECT_EQ(header.payload_size(), chunks.size());
  EXPECT_EQ(chunks, ToWire(batch).value().payload());

  // The first image's bytes were not copied into the frames: a slice points at them.
  const char* image = batch.GetRows<Image>("images").value()->at(0).bytes.data();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(queue.frames[1].Dump(&slices).ok());
  bool aliased = false;
  for (const grpc::Slice& slice : slices)
    aliased |= reinterpret_cast<const char*>(slice.begin()) == image;
  EXPECT_TRUE(aliased);

  const DataProto received = ReadInput(&queue);
  EXPECT_EQ(*received.GetRows<Image>("images").value(), *batch.GetRows<Image>("images").value());
}

TEST(SessionStreamTest, ReadsChunksFromAnyProtobufWriterWhateverTheirSlicing) {
  const DataProto batch = ImageBatch(50000);
  const v1::DataProto contiguous = ToWire(batch).value();
  v1::CallRequest request;
  request.set_call_id(7);
  *request.mutable_input() = contiguous;
  request.mutable_input()->clear_payload();
  FrameQueue queue;
  queue.frames.push_back(Frame(HeaderFrameBytes(request)));
  const std::string& payload = contiguous.payload();
  for (size_t offset = 0; offset < payload.size(); offset += 30001) {
    // Cut inside the tag/length prefix and inside the data.
    queue.frames.push_back(Frame(ChunkFrameBytes(payload.substr(offset, 30001)), {1, 2, 100}));
  }
  const DataProto received = ReadInput(&queue);
  EXPECT_EQ(*received.GetRows<Image>("images").value(), *batch.GetRows<Image>("images").value());
}

TEST(SessionStreamTest, ErrorResponsesCarryNoPayload) {
  v1::CallResponse response;
  response.set_call_id(3);
  response.mutable_error()->set_code(5);
  response.mutable_error()->set_message("no such method");
  FrameQueue queue;
  ASSERT_TRUE(WriteCallResponse(&queue, response, ScatteredPayload()));
  ASSERT_EQ(queue.frames.size(), 1u);
  DRAY_ASSERT_OK_AND_ASSIGN(std::optional<Received<v1::CallResponse>> read,
                            ReadCallResponse(&queue));
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->header.error().message(), "no such method");
}

TEST(SessionStreamTest, LargePayloadsOfOneNodeTravelInSharedMemory) {
  DRAY_ASSERT_OK_AND_ASSIGN(auto worker, SegmentPassage::Listen("secret"));
  DRAY_ASSERT_OK_AND_ASSIGN(auto controller, SegmentPassage::Connect(worker->address(), "secret"));
  ScatteredPayload payload;
  const DataProto batch = ImageBatch(kSharedPayloadBytes);
  FrameQueue queue;
  ASSERT_TRUE(WriteCallRequest(&queue, Request(batch, &payload), payload, controller.get()));
  ASSERT_EQ(queue.frames.size(), 1u) << "no chunk frames follow";
  const v1::DataProto input = Parsed(queue.frames.front()).header().input();
  EXPECT_EQ(input.shared_extents_size(), 1);
  EXPECT_EQ(input.payload_size(), payload.size);
  EXPECT_TRUE(input.payload().empty());

  const DataProto received = ReadInput(&queue, worker.get());
  EXPECT_EQ(*received.GetRows<Image>("images").value(), *batch.GetRows<Image>("images").value());
  EXPECT_TRUE(received.GetTensor("x").value().equal(at::arange(2, at::kLong)));

  // Without a passage, a header naming a segment is refused.
  ASSERT_TRUE(WriteCallRequest(&queue, Request(batch, &payload), payload, controller.get()));
  EXPECT_THAT(ReadCallRequest(&queue).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no passage")));
}

TEST(SessionStreamTest, AResultCarryingRowsOfItsInputHandsThemBack) {
  DRAY_ASSERT_OK_AND_ASSIGN(auto worker, SegmentPassage::Listen("secret"));
  DRAY_ASSERT_OK_AND_ASSIGN(auto controller, SegmentPassage::Connect(worker->address(), "secret"));
  const size_t image_bytes = kSharedPayloadBytes + 333;  // no size another test pools
  const DataProto batch = ImageBatch(image_bytes);
  ScatteredPayload payload;
  FrameQueue requests;
  ASSERT_TRUE(WriteCallRequest(&requests, Request(batch, &payload), payload, controller.get()));
  std::optional<DataProto> input = ReadInput(&requests, worker.get());

  // The worker answers its input's images with a new column beside them.
  DataProto result = *input;
  DRAY_ASSERT_OK(result.AddTensor("y", at::arange(7, 9, at::kLong)));
  DetachedWire wire = ToDetachedWire(result).value();
  v1::CallResponse response;
  response.set_call_id(7);
  *response.mutable_result() = std::move(wire.header);
  FrameQueue responses;
  ASSERT_TRUE(WriteCallResponse(&responses, std::move(response), wire.payload, worker.get()));
  const v1::CallResponseFrame frame = [&] {
    v1::CallResponseFrame parsed;
    EXPECT_TRUE(parsed.ParseFromString(BytesOf(responses.frames.front())));
    return parsed;
  }();
  const auto& extents = frame.header().result().shared_extents();
  uint64_t handed_back = 0;
  for (const v1::SegmentExtent& extent : extents) {
    if (extent.size() >= image_bytes) handed_back += extent.size();
  }
  EXPECT_EQ(handed_back, 2 * image_bytes) << "both images go back by number, not copied";

  // The worker lets go of its input; the controller's pages stay the
  // result's while it lives, whatever the controller writes meanwhile.
  wire = DetachedWire();
  result = DataProto();
  input.reset();
  DRAY_ASSERT_OK_AND_ASSIGN(std::optional<Received<v1::CallResponse>> read,
                            ReadCallResponse(&responses, nullptr, controller.get()));
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto back, FromWire(read->header.result(), read->payload));
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(WriteCallRequest(&requests, Request(ImageBatch(image_bytes, "yz"), &payload),
                                 payload, controller.get()));
    ReadInput(&requests, worker.get());
  }
  EXPECT_EQ(*back.GetRows<Image>("images").value(), *batch.GetRows<Image>("images").value());
  EXPECT_TRUE(back.GetTensor("x").value().equal(at::arange(2, at::kLong)));
  EXPECT_TRUE(back.GetTensor("y").value().equal(at::arange(7, 9, at::kLong)));
}

TEST(SessionStreamTest, APassageThatFailsLeavesThePayloadToTheStream) {
  DRAY_ASSERT_OK_AND_ASSIGN(auto worker, SegmentPassage::Listen("secret"));
  DRAY_ASSERT_OK_AND_ASSIGN(auto controller, SegmentPassage::Connect(worker->address(), "secret"));
  worker.reset();  // the peer is gone: passing a segment fails
  ScatteredPayload payload;
  const DataProto batch = ImageBatch(kSharedPayloadBytes);
  FrameQueue queue;
  ASSERT_TRUE(WriteCallRequest(&queue, Request(batch, &payload), payload, controller.get()));
  EXPECT_GT(queue.frames.size(), 1u) << "chunk frames follow";
  EXPECT_TRUE(Parsed(queue.frames.front()).header().input().shared_extents().empty());
  const DataProto received = ReadInput(&queue);
  EXPECT_EQ(*received.GetRows<Image>("images").value(), *batch.GetRows<Image>("images").value());
}

TEST(SessionStreamTest, ProgressFramesPrecedeTheirResponse) {
  FrameQueue queue;
  for (int done = 1; done <= 2; ++done) {
    v1::CallProgress progress;
    progress.set_call_id(4);
    progress.set_what("steps");
    progress.set_done(done);
    progress.set_total(2);
    ASSERT_TRUE(WriteCallProgress(&queue, progress));
  }
  v1::CallResponse response;
  response.set_call_id(4);
  response.mutable_error()->set_code(1);
  ASSERT_TRUE(WriteCallResponse(&queue, response, ScatteredPayload()));
  const FrameQueue copy = queue;
  std::vector<int64_t> seen;
  DRAY_ASSERT_OK_AND_ASSIGN(std::optional<Received<v1::CallResponse>> read,
                            ReadCallResponse(&queue, [&](const v1::CallProgress& progress) {
                              EXPECT_EQ(progress.call_id(), 4u);
                              seen.push_back(progress.done());
                            }));
  EXPECT_EQ(read->header.call_id(), 4u);
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 2}));
  // A reader that takes no progress refuses it.
  FrameQueue unexpected = copy;
  EXPECT_THAT(ReadCallResponse(&unexpected),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected a header frame")));
}

// Detached returns a call header announcing `payload_size` streamed bytes.
std::string DetachedHeader(uint64_t payload_size) {
  v1::CallRequest request;
  request.mutable_input()->set_payload_size(payload_size);
  return HeaderFrameBytes(request);
}

absl::Status ReadFrom(std::vector<std::string> frames) {
  FrameQueue queue;
  for (const std::string& frame : frames) queue.frames.push_back(Frame(frame));
  return ReadCallRequest(&queue).status();
}

TEST(SessionStreamTest, MalformedMessagesAreErrorsNamingTheProblem) {
  EXPECT_THAT(ReadFrom({DetachedHeader(10), ChunkFrameBytes("12345")}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("after 5 of 10 payload bytes")));
  EXPECT_THAT(ReadFrom({DetachedHeader(10), DetachedHeader(10)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("inside a payload")));
  EXPECT_THAT(ReadFrom({DetachedHeader(10), ChunkFrameBytes(std::string(20, 'x'))}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("more payload bytes")));
  EXPECT_THAT(ReadFrom({ChunkFrameBytes("abc")}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected a header frame")));
  EXPECT_THAT(ReadFrom({std::string("\xff\xff\xff", 3)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a valid protobuf")));

  std::string short_chunk = ChunkFrameBytes(std::string(50, 'x'));
  short_chunk[1] = 100;  // the length says 100; 50 bytes follow
  EXPECT_THAT(ReadFrom({DetachedHeader(100), short_chunk}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("announces 100 bytes and carries 50")));

  v1::CallRequest partial;
  partial.mutable_input()->set_payload("12345");
  partial.mutable_input()->set_payload_size(10);
  EXPECT_THAT(
      ReadFrom({HeaderFrameBytes(partial)}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("5 of its 10 payload bytes inline")));
}

}  // namespace
}  // namespace dray
