// ImageEditServer's admission, batching and progress over a fake backend:
// a real gRPC server in this process, no workers, milliseconds.
#include "workers/edit/image_edit_server.h"

#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>

#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "dray/v1/image_edit.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/rpc/grpc_util.h"
#include "workers/edit/fake_edit_backend.h"
#include "workers/image/image_codec.h"
#include "workers/pipeline/edit_batch.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

class ImageEditServerUnitTest : public ::testing::Test {
 protected:
  void Serve(ServeOptions options = {}) {
    options.address = "127.0.0.1:0";
    server_ = ImageEditServer::Start(&backend_, options).value();
    stub_ = v1::ImageEditService::NewStub(
        CreateDrayChannel(absl::StrCat("127.0.0.1:", server_->port())));
  }

  static v1::EditImageRequest Request(int steps = 2) {
    v1::EditImageRequest request;
    request.set_image(EncodePng(at::zeros({8, 8, 3}, at::kByte)).value());
    request.set_instruction("make it blue");
    request.set_num_inference_steps(steps);
    return request;
  }

  absl::StatusOr<v1::EditImageBatchResponse> EditBatch(
      const std::vector<v1::EditImageRequest>& requests) {
    grpc::ClientContext context;
    SetDeadline(&context, absl::Seconds(30));
    v1::EditImageBatchRequest batch;
    for (const v1::EditImageRequest& request : requests) *batch.add_requests() = request;
    v1::EditImageBatchResponse response;
    DRAY_RETURN_IF_ERROR(ToAbslStatus(stub_->EditBatch(&context, batch, &response), "EditBatch"));
    return response;
  }

  absl::StatusOr<v1::EditImageResponse> Edit(const v1::EditImageRequest& request,
                                             absl::Duration timeout = absl::Seconds(30)) {
    grpc::ClientContext context;
    SetDeadline(&context, timeout);
    v1::EditImageResponse response;
    DRAY_RETURN_IF_ERROR(ToAbslStatus(stub_->Edit(&context, request, &response), "Edit"));
    return response;
  }

  FakeEditBackend backend_{/*batch_size=*/1};  // 2 workers: at most 2 rows a call
  std::unique_ptr<ImageEditServer> server_;
  std::unique_ptr<v1::ImageEditService::Stub> stub_;
};

TEST_F(ImageEditServerUnitTest, EqualOptionsShareCallsOfAtMostBatchSizeRowsPerWorker) {
  ServeOptions options;
  options.max_wait = absl::ZeroDuration();
  Serve(options);
  DRAY_ASSERT_OK_AND_ASSIGN(v1::EditImageBatchResponse response,
                            EditBatch({Request(), Request(), Request()}));
  ASSERT_EQ(response.responses_size(), 3);
  EXPECT_EQ(response.responses(0).batch_rows(), 2);  // admitted together, split by the limit
  EXPECT_EQ(response.responses(2).batch_rows(), 1);
  EXPECT_THAT(backend_.call_rows(), ElementsAre(2, 1));
  EXPECT_EQ(response.responses(1).image(), Request().image());
}

TEST_F(ImageEditServerUnitTest, DifferentOptionsNeverShareACall) {
  ServeOptions options;
  options.max_wait = absl::ZeroDuration();
  Serve(options);
  DRAY_ASSERT_OK_AND_ASSIGN(v1::EditImageBatchResponse response,
                            EditBatch({Request(2), Request(3)}));
  EXPECT_EQ(response.responses(0).batch_rows(), 1);
  EXPECT_EQ(response.responses(1).batch_rows(), 1);
  EXPECT_THAT(backend_.call_rows(), ElementsAre(1, 1));
}

TEST_F(ImageEditServerUnitTest, BadRequestsAreRefusedBeforeTheBackend) {
  Serve();
  v1::EditImageRequest request = Request();
  request.set_image("GIF89a");
  EXPECT_THAT(Edit(request), StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr("row 0: image data (6 bytes) is neither")));
  request = Request();
  request.set_instruction(" ");
  EXPECT_THAT(Edit(request), StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr("row 0: the instruction is empty")));
  EXPECT_THAT(EditBatch({Request(), Request(0)}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("row 1: num_inference_steps must lie in [1, 1000]")));
  EXPECT_TRUE(backend_.call_rows().empty());
}

TEST_F(ImageEditServerUnitTest, ABatchLargerThanTheQueueIsInvalidNotRetryable) {
  ServeOptions options;
  options.max_queue = 2;
  Serve(options);
  EXPECT_THAT(EditBatch({Request(), Request(), Request()}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("send at most that many")));
  EXPECT_TRUE(backend_.call_rows().empty());
}

TEST_F(ImageEditServerUnitTest, AnUnhealthyBackendAnswersUnavailable) {
  Serve();
  backend_.set_health(absl::UnavailableError("worker rank 1 (pid 9) killed by signal 9"));
  EXPECT_THAT(Edit(Request()),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("killed by signal 9")));
}

TEST_F(ImageEditServerUnitTest, EditStreamRelaysEveryStepThenTheResult) {
  Serve();
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(30));
  auto events = stub_->EditStream(&context, Request());
  std::vector<std::string> seen;
  v1::EditImageEvent event;
  while (events->Read(&event)) {
    seen.push_back(event.has_progress()
                       ? absl::StrCat(event.progress().step(), "/", event.progress().steps())
                       : "result");
  }
  DRAY_ASSERT_OK(ToAbslStatus(events->Finish(), "EditStream"));
  // Steps reported faster than the handler wakes are coalesced into the
  // latest; the last step always precedes the result.
  ASSERT_GE(seen.size(), 2u);
  EXPECT_EQ(seen[seen.size() - 2], "2/2");
  EXPECT_EQ(seen.back(), "result");
}

TEST_F(ImageEditServerUnitTest, AStringThatIsNotUtf8IsAnInvalidArgument) {
  Serve();
  v1::EditImageRequest request = Request();
  request.set_instruction("make it \xff\xfe blue");  // sent as is; the server cannot parse it
  EXPECT_THAT(Edit(request), StatusIs(absl::StatusCode::kInvalidArgument,
                                      AllOf(HasSubstr("dray.v1.ImageEditService/Edit"),
                                            HasSubstr("not valid UTF-8"))));
  DRAY_EXPECT_OK(Edit(Request()).status());
}

// Every answer carries a request id; an error's message ends with it, so
// that the server's log line of the error can be found.
TEST_F(ImageEditServerUnitTest, ErrorsNameTheRequestIdTheClientGets) {
  ServeOptions options;
  options.max_image_bytes = 64;
  Serve(options);
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(30));
  v1::EditImageResponse response;
  const grpc::Status refused = stub_->Edit(&context, Request(), &response);
  const auto ids = context.GetServerInitialMetadata().equal_range(kRequestIdMetadata);
  ASSERT_NE(ids.first, ids.second);
  const std::string id(ids.first->second.data(), ids.first->second.size());
  EXPECT_THAT(id, MatchesRegex("[0-9a-f]{16}"));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), AllOf(HasSubstr("at most 64 are accepted"),
                                             EndsWith(absl::StrCat("[request ", id, "]"))));
}

TEST_F(ImageEditServerUnitTest, ClientDeadlinesEndTheWait) {
  backend_.Hold();
  Serve();
  EXPECT_THAT(Edit(Request(), absl::Milliseconds(100)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  backend_.Release();
  DRAY_EXPECT_OK(Edit(Request()).status());
}

// A batch whose every client has gone is cancelled, so that the workers
// need not finish what no one waits for.
TEST_F(ImageEditServerUnitTest, ABatchNoClientAwaitsIsCancelled) {
  backend_.Hold();
  Serve();
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(30));
  v1::EditImageResponse response;
  std::thread client([&] { stub_->Edit(&context, Request(), &response); });
  backend_.WaitForCalls(1);
  context.TryCancel();
  EXPECT_THAT(backend_.WaitForCancel(), StatusIs(absl::StatusCode::kCancelled,
                                                 HasSubstr("every client of the batch has gone")));
  client.join();
  backend_.Release();
  DRAY_EXPECT_OK(Edit(Request()).status());
}

}  // namespace
}  // namespace dray
