// ImageEditService end to end: an ImageEditServer over two real `dray
// worker` processes, called over gRPC as clients would call it.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "dray/v1/image_edit.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "reflection_list.pb.h"
#include "runtime/rpc/grpc_util.h"
#include "runtime/rpc/raw_bidi_call.h"
#include "tests/edit/edit_test_util.h"
#include "tests/edit/serving.h"
#include "tests/runtime/test_util.h"
#include "workers/edit/image_edit_server.h"
#include "workers/image/image_codec.h"
#include "workers/models/bpe_tokenizer.h"
#include "workers/pipeline/edit_batch.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::grpc::health::v1::HealthCheckResponse;
using ::testing::AllOf;
using ::testing::HasSubstr;

absl::StatusOr<HealthCheckResponse::ServingStatus> Health(const Serving& serving) {
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(5));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(kImageEditServiceName);
  HealthCheckResponse response;
  DRAY_RETURN_IF_ERROR(ToAbslStatus(
      grpc::health::v1::Health::NewStub(serving.channel)->Check(&context, request, &response),
      "health"));
  return response.status();
}

class ImageEditServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { serving_ = new Serving(Serve(TestConfig())); }
  static void TearDownTestSuite() { delete serving_; }
  static Serving* serving_;
};
Serving* ImageEditServerTest::serving_ = nullptr;

TEST_F(ImageEditServerTest, EditAnswersWhatTheWorkersCompute) {
  const v1::EditImageRequest request = Request(2, /*seed=*/7);
  DRAY_ASSERT_OK_AND_ASSIGN(v1::EditImageResponse response, Edit(*serving_, request));
  EXPECT_EQ(response.seed(), 7);
  DRAY_ASSERT_OK_AND_ASSIGN(
      DataProto direct,
      serving_->controller->Edit(
          MakeEditBatch({request.image()}, {request.instruction()}, {7}).value()));
  const at::Tensor expected = EditedImages(direct).front();
  const at::Tensor served = DecodeImage(response.image()).value();
  EXPECT_TRUE(at::equal(served, expected));
  EXPECT_EQ(response.width(), served.size(1));
  EXPECT_EQ(response.height(), served.size(0));
}

TEST_F(ImageEditServerTest, EditStreamReportsEveryStepThenTheResult) {
  v1::EditImageRequest request = Request(1, /*seed=*/9);
  request.set_num_inference_steps(8);
  grpc::ClientContext context;
  SetDeadline(&context, absl::Minutes(2));
  auto events = v1::ImageEditService::NewStub(serving_->channel)->EditStream(&context, request);
  std::vector<int64_t> steps;
  v1::EditImageEvent event;
  std::optional<v1::EditImageResponse> result;
  while (events->Read(&event)) {
    if (event.has_progress()) {
      EXPECT_FALSE(result.has_value()) << "progress after the result";
      EXPECT_EQ(event.progress().steps(), 8);
      steps.push_back(event.progress().step());
    }
    if (event.has_result()) result = event.result();
  }
  DRAY_ASSERT_OK(ToAbslStatus(events->Finish(), "EditStream"));
  ASSERT_FALSE(steps.empty());
  EXPECT_TRUE(std::is_sorted(steps.begin(), steps.end()));
  EXPECT_EQ(steps.back(), 8);
  ASSERT_TRUE(result.has_value());
  DRAY_ASSERT_OK_AND_ASSIGN(v1::EditImageResponse unary, Edit(*serving_, request));
  EXPECT_EQ(result->image(), unary.image());
}

TEST_F(ImageEditServerTest, EditBatchAnswersInOrder) {
  v1::EditImageBatchRequest request;
  for (int i = 0; i < 3; ++i) *request.add_requests() = Request(i, 100 + i);
  request.mutable_requests(1)->set_width(48);
  request.mutable_requests(1)->set_height(32);
  DRAY_ASSERT_OK_AND_ASSIGN(v1::EditImageBatchResponse response, EditBatch(*serving_, request));
  ASSERT_EQ(response.responses_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(response.responses(i).seed(), 100 + i);
    DRAY_ASSERT_OK_AND_ASSIGN(v1::EditImageResponse alone, Edit(*serving_, request.requests(i)));
    EXPECT_EQ(response.responses(i).image(), alone.image()) << "request " << i;
  }
  EXPECT_EQ(response.responses(1).width(), 48);
  EXPECT_EQ(response.responses(1).height(), 32);
}

TEST_F(ImageEditServerTest, ConcurrentClientsAreAllAnsweredInSharedBatches) {
  constexpr int kClients = 32;
  std::vector<absl::StatusOr<v1::EditImageResponse>> results(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] { results[i] = Edit(*serving_, Request(i % 4, i)); });
  }
  for (std::thread& client : clients) client.join();
  int largest_batch = 0;
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    EXPECT_EQ(results[i]->seed(), i);
    largest_batch = std::max(largest_batch, results[i]->batch_rows());
  }
  EXPECT_GT(largest_batch, 1) << "concurrent requests should share worker calls";
  EXPECT_LE(largest_batch, 4) << "at most batch_size rows per worker";
}

TEST_F(ImageEditServerTest, InvalidRequestsAreInvalidArgument) {
  v1::EditImageRequest request = Request(0, 1);
  request.set_image("GIF89a not supported");
  EXPECT_THAT(Edit(*serving_, request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("neither PNG nor JPEG")));
  request = Request(0, 1);
  request.set_instruction("");
  EXPECT_THAT(Edit(*serving_, request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("instruction is empty")));
  request = Request(0, 1);
  request.set_num_inference_steps(0);
  EXPECT_THAT(Edit(*serving_, request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_inference_steps")));
  request = Request(0, 1);
  request.set_image(std::string((32 << 20) + 1, 'x'));
  EXPECT_THAT(Edit(*serving_, request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 33554432")));
  // The server still serves.
  DRAY_EXPECT_OK(Edit(*serving_, Request(0, 1)).status());
}

TEST_F(ImageEditServerTest, AModelForOneImageRefusesMore) {
  v1::EditImageRequest request = Request(0, 1);
  request.add_more_images(Request(1, 1).image());
  EXPECT_THAT(Edit(*serving_, request),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("row 0: 2 input images; this model takes 1"),
                             ::testing::Not(HasSubstr("rank")))));  // refused before the workers
}

// An Edit-Plus model (Qwen-Image-Edit-2509/2511) served: requests carry one
// to three pictures and share worker calls, each answered as alone.
class EditPlusServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    serving_ = new Serving(Serve(TestConfig({absl::StrCat(
        "worker.image_edit.model_path=", TinyModelDir(qwen_image::EditPipelineKind::kEditPlus))})));
  }
  static void TearDownTestSuite() { delete serving_; }

  // PlusRequest: test image `first` and then `more` others as its pictures.
  static v1::EditImageRequest PlusRequest(int first, int more, int64_t seed) {
    v1::EditImageRequest request = Request(first, seed);
    for (int i = 1; i <= more; ++i) request.add_more_images(Request(first + i, seed).image());
    request.set_instruction("put picture 1 into the last picture");
    return request;
  }
  static Serving* serving_;
};
Serving* EditPlusServerTest::serving_ = nullptr;

TEST_F(EditPlusServerTest, SeveralPicturesAnswerAsTheWorkersCompute) {
  const v1::EditImageRequest request = PlusRequest(0, 2, /*seed=*/5);
  DRAY_ASSERT_OK_AND_ASSIGN(v1::EditImageResponse response, Edit(*serving_, request));
  const std::vector<std::vector<Bytes>> pictures = {
      {request.image(), request.more_images(0), request.more_images(1)}};
  DRAY_ASSERT_OK_AND_ASSIGN(
      DataProto direct,
      serving_->controller->Edit(MakeEditBatch(pictures, {request.instruction()}, {5}).value()));
  EXPECT_TRUE(at::equal(DecodeImage(response.image()).value(), EditedImages(direct).front()));
}

TEST_F(EditPlusServerTest, RequestsWithDifferentPictureCountsShareABatch) {
  v1::EditImageBatchRequest request;
  for (int more = 0; more < 3; ++more) *request.add_requests() = PlusRequest(more, more, 10 + more);
  DRAY_ASSERT_OK_AND_ASSIGN(v1::EditImageBatchResponse response, EditBatch(*serving_, request));
  ASSERT_EQ(response.responses_size(), 3);
  for (int i = 0; i < 3; ++i) {
    DRAY_ASSERT_OK_AND_ASSIGN(v1::EditImageResponse alone, Edit(*serving_, request.requests(i)));
    EXPECT_EQ(response.responses(i).image(), alone.image()) << "request " << i;
  }
}

TEST_F(EditPlusServerTest, PicturesTheModelCannotTakeAreRefusedNamingThem) {
  v1::EditImageRequest request = PlusRequest(0, 3, 1);
  EXPECT_THAT(Edit(*serving_, request),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("more_images holds 3 images; at most 2")));
  request = PlusRequest(0, 1, 1);
  request.set_instruction("the sky of picture 3");
  EXPECT_THAT(Edit(*serving_, request),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("names \"picture 3\" but the row has 2 input images"),
                             ::testing::Not(HasSubstr("rank")))));
  request = PlusRequest(0, 1, 1);
  request.set_more_images(0, "GIF89a");
  EXPECT_THAT(Edit(*serving_, request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("picture 2: ")));
}

// InstructionOfTokens returns " a a a ..." of exactly `tokens` tokens.
std::string InstructionOfTokens(const BpeTokenizer& tokenizer, int64_t tokens) {
  std::string text;
  while (static_cast<int64_t>(tokenizer.EncodeText(text).size()) < tokens) text += " a";
  EXPECT_EQ(static_cast<int64_t>(tokenizer.EncodeText(text).size()), tokens);
  return text;
}

// Every request the budget admits runs; one token or pixel more is refused
// before any worker sees it, naming the limit.
TEST_F(ImageEditServerTest, RequestsAreHeldToThePixelAndPromptBudget) {
  const BpeTokenizer tokenizer = BpeTokenizer::FromDirectory(TinyModelDir() + "/tokenizer").value();
  const int64_t limit = serving_->controller->config().max_prompt_tokens;
  v1::EditImageRequest request = Request(0, 1);
  request.set_instruction(InstructionOfTokens(tokenizer, limit));
  DRAY_EXPECT_OK(Edit(*serving_, request).status());
  request.set_instruction(InstructionOfTokens(tokenizer, limit + 1));
  EXPECT_THAT(Edit(*serving_, request), StatusIs(absl::StatusCode::kInvalidArgument,
                                                 HasSubstr("max_prompt_tokens allows 1024")));
  request = Request(0, 1);
  std::string negative;
  while (negative.size() < (16 << 10)) negative += " n";  // a word each: 8192 tokens at least
  request.set_negative_prompt(negative);
  EXPECT_THAT(Edit(*serving_, request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative prompt has")));
  request = Request(0, 1);
  request.set_width(1040);
  request.set_height(1040);
  EXPECT_THAT(Edit(*serving_, request),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("worker.image_edit.max_pixels allows 1048576")));
}

TEST_F(ImageEditServerTest, ClientDeadlinesAreHonoured) {
  v1::EditImageRequest slow = Request(0, 1);
  slow.set_num_inference_steps(200);
  EXPECT_THAT(Edit(*serving_, slow, absl::Milliseconds(300)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  DRAY_EXPECT_OK(Edit(*serving_, Request(1, 1)).status());
}

// ListServices asks the server's reflection service what it serves, as
// grpcurl list does (raw bytes on the reflection method).
std::vector<std::string> ListServices(const std::shared_ptr<grpc::Channel>& channel) {
  std::vector<std::string> services;
  absl::StatusOr<std::unique_ptr<RawBidiCall>> call =
      RawBidiCall::Start(channel, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                         absl::Now() + absl::Seconds(5));
  if (!call.ok()) return services;
  dray::testing::reflection::ServerReflectionRequest request;
  request.set_list_services("");
  grpc::Slice slice(request.SerializeAsString());
  EXPECT_TRUE((*call)->Write(grpc::ByteBuffer(&slice, 1)));
  grpc::ByteBuffer reply;
  if (!(*call)->Read(&reply)) return services;
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(reply.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& piece : slices) {
    bytes.append(reinterpret_cast<const char*>(piece.begin()), piece.size());
  }
  dray::testing::reflection::ServerReflectionResponse response;
  EXPECT_TRUE(response.ParseFromString(bytes));
  for (const auto& service : response.list_services_response().service()) {
    services.push_back(service.name());
  }
  return services;
}

TEST_F(ImageEditServerTest, ServesHealthAndReflection) {
  EXPECT_EQ(Health(*serving_).value(), HealthCheckResponse::SERVING);
  EXPECT_THAT(ListServices(serving_->channel),
              ::testing::IsSupersetOf(
                  {std::string(kImageEditServiceName), std::string("grpc.health.v1.Health")}));
}

TEST(ImageEditServerLimitsTest, AFullQueueAnswersResourceExhausted) {
  ServeOptions options;
  options.max_queue = 2;
  Serving serving = Serve(TestConfig({"worker.image_edit.num_inference_steps=8"}), options);
  constexpr int kClients = 16;
  std::vector<absl::StatusOr<v1::EditImageResponse>> results(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i)
    clients.emplace_back([&, i] { results[i] = Edit(serving, Request(0, i)); });
  for (std::thread& client : clients) client.join();
  int answered = 0, refused = 0;
  for (const auto& result : results) {
    if (result.ok()) ++answered;
    if (result.status().code() == absl::StatusCode::kResourceExhausted) {
      ++refused;
      EXPECT_THAT(result.status().message(), HasSubstr("retry later"));
    }
  }
  EXPECT_GT(answered, 0);
  EXPECT_GT(refused, 0);
  EXPECT_EQ(answered + refused, kClients);
}

TEST(ImageEditServerFailureTest, AKilledWorkerMakesRequestsFailFast) {
  Serving serving = Serve(TestConfig());
  HealthWatch health(serving);
  // A long request; its worker is killed after the first step, so it must
  // end with UNAVAILABLE, not with a result. One request runs on rank 0
  // alone (rows are split unevenly, without padding).
  v1::EditImageRequest request = Request(0, 1);
  request.set_num_inference_steps(1000);
  grpc::ClientContext context;
  SetDeadline(&context, absl::Minutes(2));
  auto events = v1::ImageEditService::NewStub(serving.channel)->EditStream(&context, request);
  v1::EditImageEvent event;
  ASSERT_TRUE(events->Read(&event));  // a first step is done: the request is being denoised
  ASSERT_TRUE(event.has_progress());
  ASSERT_EQ(kill(serving.controller->group()->pids()[0], SIGKILL), 0);
  while (events->Read(&event)) EXPECT_FALSE(event.has_result());
  EXPECT_THAT(ToAbslStatus(events->Finish(), "EditStream"),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("worker rank 0")));
  EXPECT_THAT(Edit(serving, Request(0, 2), absl::Minutes(1)),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("killed by signal 9")));
  EXPECT_TRUE(health.WaitFor(HealthCheckResponse::NOT_SERVING));
}

// The service heals: a killed worker and then a stopped one make the
// controller restart the group (NOT_SERVING meanwhile), which serves again;
// past max_restarts it gives up and stays NOT_SERVING.
TEST(ImageEditServerFailureTest, FailedWorkersAreRestartedUntilTheRestartsAreUsedUp) {
  Serving serving = Serve(TestConfig(), {}, QuickHealing(2));
  HealthWatch health(serving);
  ASSERT_TRUE(health.WaitFor(HealthCheckResponse::SERVING));
  const std::vector<pid_t> first = serving.controller->group()->pids();
  ASSERT_EQ(kill(first[1], SIGKILL), 0);
  EXPECT_TRUE(health.WaitFor(HealthCheckResponse::NOT_SERVING));
  EXPECT_TRUE(health.WaitFor(HealthCheckResponse::SERVING));
  DRAY_EXPECT_OK(Edit(serving, Request(0, 1)).status());
  EXPECT_EQ(serving.controller->restarts(), 1);
  for (pid_t pid : first) EXPECT_FALSE(ProcessAlive(pid)) << pid;  // the old group is reaped

  const std::vector<pid_t> second = serving.controller->group()->pids();
  ASSERT_EQ(kill(second[0], SIGSTOP), 0);  // a stall: no exit, no answer
  EXPECT_TRUE(health.WaitFor(HealthCheckResponse::NOT_SERVING));
  EXPECT_TRUE(health.WaitFor(HealthCheckResponse::SERVING));
  DRAY_EXPECT_OK(Edit(serving, Request(0, 2)).status());
  EXPECT_EQ(serving.controller->restarts(), 2);
  for (pid_t pid : second) EXPECT_FALSE(ProcessAlive(pid)) << pid;

  ASSERT_EQ(kill(serving.controller->group()->pids()[0], SIGKILL), 0);
  EXPECT_TRUE(serving.controller->WaitUntilGivenUp(absl::Minutes(1)));
  EXPECT_THAT(Edit(serving, Request(0, 3), absl::Minutes(1)),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("restarts are used up")));
  EXPECT_TRUE(health.WaitFor(HealthCheckResponse::NOT_SERVING));
}

// StartStream starts an EditStream of `steps` steps and waits for its
// first step, so that the request is being denoised.
std::unique_ptr<grpc::ClientReader<v1::EditImageEvent>> StartStream(const Serving& serving,
                                                                    grpc::ClientContext* context,
                                                                    int steps) {
  v1::EditImageRequest request = Request(0, 1);
  request.set_num_inference_steps(steps);
  SetDeadline(context, absl::Minutes(2));
  auto events = v1::ImageEditService::NewStub(serving.channel)->EditStream(context, request);
  v1::EditImageEvent event;
  EXPECT_TRUE(events->Read(&event) && event.has_progress());
  return events;
}

// Graceful shutdown: admission stops at once, and a request in flight
// finishes within the grace. The request in flight is long (1000 steps,
// seconds at ~270 steps/s) so that it still runs when the second one asks:
// with 20 it could finish first on a fast or idle machine, the drain then
// completes and the second request meets a stopped server (CANCELLED).
TEST(ImageEditServerShutdownTest, DrainLetsRequestsInFlightFinish) {
  Serving serving = Serve(TestConfig());
  HealthWatch health(serving);
  grpc::ClientContext context;
  auto events = StartStream(serving, &context, /*steps=*/1000);
  std::thread drain([&] { serving.server->Drain(absl::Minutes(2)); });
  EXPECT_TRUE(health.WaitFor(HealthCheckResponse::NOT_SERVING));
  EXPECT_THAT(Edit(serving, Request(1, 1)),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));
  v1::EditImageEvent event;
  bool edited = false;
  while (events->Read(&event)) edited |= event.has_result();
  DRAY_EXPECT_OK(ToAbslStatus(events->Finish(), "EditStream"));
  EXPECT_TRUE(edited);
  drain.join();
}

// A request that outlasts the grace is cancelled for real: the cancellation
// reaches the denoising loop, which stops between two steps (its workers
// live on), and the client hears why.
TEST(ImageEditServerShutdownTest, DrainCancelsWhatOutlastsTheGrace) {
  ImageEditController::Options patient;
  patient.cancel_grace = absl::Minutes(2);  // the workers stop by themselves
  Serving serving = Serve(TestConfig(), {}, patient);
  grpc::ClientContext context;
  auto events = StartStream(serving, &context, /*steps=*/1000);
  const std::vector<pid_t> workers = serving.controller->group()->pids();
  serving.server->Drain(absl::Milliseconds(100));
  v1::EditImageEvent event;
  while (events->Read(&event)) EXPECT_FALSE(event.has_result());
  EXPECT_THAT(ToAbslStatus(events->Finish(), "EditStream"),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("grace period"), HasSubstr("stopped after step"))));
  for (pid_t pid : workers) EXPECT_TRUE(ProcessAlive(pid)) << pid;
}

// Workers that do not stop within the cancel grace (a stalled one here) are
// killed, and reaped.
TEST(ImageEditServerShutdownTest, DrainKillsWorkersThatDoNotStop) {
  ImageEditController::Options impatient;
  impatient.cancel_grace = absl::Milliseconds(100);
  Serving serving = Serve(TestConfig(), {}, impatient);
  grpc::ClientContext context;
  auto events = StartStream(serving, &context, /*steps=*/1000);
  const std::vector<pid_t> workers = serving.controller->group()->pids();
  ASSERT_EQ(kill(workers[0], SIGSTOP), 0);
  serving.server->Drain(absl::Milliseconds(100));
  v1::EditImageEvent event;
  while (events->Read(&event)) EXPECT_FALSE(event.has_result());
  EXPECT_THAT(ToAbslStatus(events->Finish(), "EditStream"),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("grace period")));
  for (pid_t pid : workers) EXPECT_FALSE(ProcessAlive(pid)) << pid;
}

}  // namespace
}  // namespace dray
