// HttpGateway in front of a real ImageEditServer on a fake backend: real
// HTTP on loopback, real gRPC in process, no workers.
#include "workers/edit/http_gateway.h"

#include <ATen/ATen.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "workers/edit/fake_edit_backend.h"
#include "workers/edit/image_edit_server.h"
#include "workers/image/image_codec.h"

namespace dray {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;

class HttpGatewayTest : public ::testing::Test {
 protected:
  void Serve(HttpOptions options = {}) {
    ServeOptions serve;
    serve.address = "127.0.0.1:0";
    serve.bearer_token = options.bearer_token;
    server_ = ImageEditServer::Start(&backend_, serve).value();
    options.address = "127.0.0.1:0";
    options.metrics = &server_->metrics();
    gateway_ = HttpGateway::Start(server_->InProcessChannel(), options).value();
    client_ = std::make_unique<httplib::Client>("127.0.0.1", gateway_->port());
    client_->set_read_timeout(std::chrono::seconds(60));
  }

  httplib::Result Edit(httplib::MultipartFormDataItems fields, const std::string& picture = Png()) {
    fields.push_back({"image", picture, "picture.png", "image/png"});
    return client_->Post("/v1/images/edits", fields);
  }

  static std::string Png() { return EncodePng(at::full({8, 12, 3}, 200, at::kByte)).value(); }

  // Error: the JSON error of `result`, checked to carry its request id.
  static nlohmann::json Error(const httplib::Result& result) {
    const nlohmann::json body = nlohmann::json::parse(result->body);
    EXPECT_EQ(body["error"]["request_id"], result->get_header_value("x-request-id"));
    return body["error"];
  }

  FakeEditBackend backend_{/*batch_size=*/1};
  std::unique_ptr<ImageEditServer> server_;
  std::unique_ptr<HttpGateway> gateway_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(HttpGatewayTest, EditsAnswerAsOpenAisImagesApi) {
  Serve();
  httplib::Result result = Edit({{"prompt", "make it blue", "", ""},
                                 {"n", "2", "", ""},
                                 {"seed", "7", "", ""},
                                 {"steps", "2", "", ""}});
  ASSERT_TRUE(result);
  ASSERT_EQ(result->status, 200) << result->body;
  EXPECT_EQ(result->get_header_value("x-request-id").size(), 16u);
  const nlohmann::json body = nlohmann::json::parse(result->body);
  ASSERT_EQ(body["data"].size(), 2u);
  std::string image;
  ASSERT_TRUE(absl::Base64Unescape(body["data"][1]["b64_json"].get<std::string>(), &image));
  EXPECT_EQ(image, Png());  // the fake edits nothing
  EXPECT_EQ(body["data"][1]["seed"], 8);
  EXPECT_EQ(body["output_format"], "png");
  EXPECT_GT(body["created"].get<int64_t>(), 0);
}

TEST_F(HttpGatewayTest, JsonBodiesToo) {
  Serve();
  httplib::Result result = client_->Post(
      "/v1/images/edits",
      nlohmann::json({{"prompt", "x"}, {"image", absl::Base64Escape(Png())}, {"steps", 2}}).dump(),
      "application/json");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200) << result->body;
}

TEST_F(HttpGatewayTest, RefusalsCarryTheirStatusFieldAndRequestId) {
  Serve();
  httplib::Result result = Edit({});
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 400);
  EXPECT_EQ(Error(result)["param"], "prompt");
  EXPECT_EQ(Error(result)["type"], "invalid_request_error");

  result = Edit({{"prompt", "x", "", ""}, {"model", "gpt-image-1", "", ""}});
  EXPECT_EQ(result->status, 404);
  EXPECT_EQ(Error(result)["param"], "model");
  EXPECT_THAT(Error(result)["message"].get<std::string>(), HasSubstr("'dray-embedded' is"));

  // The service's own refusal keeps the gateway's request id.
  result = Edit({{"prompt", "x", "", ""}}, "not a picture");
  EXPECT_EQ(result->status, 400);
  EXPECT_THAT(Error(result)["message"].get<std::string>(),
              EndsWith(absl::StrCat("[request ", result->get_header_value("x-request-id"), "]")));
  EXPECT_EQ(Error(result)["code"], "invalid_argument");

  result = client_->Post("/v1/images/edits", "prompt=x", "application/x-www-form-urlencoded");
  EXPECT_EQ(result->status, 400);
  result = client_->Get("/v1/nothing");
  EXPECT_EQ(result->status, 404);
  EXPECT_EQ(Error(result)["code"], "not_found");
}

TEST_F(HttpGatewayTest, TheTokenGuardsTheApiButNotHealthOrThePage) {
  HttpOptions options;
  options.bearer_token = "secret";
  Serve(options);
  httplib::Result result = client_->Get("/v1/models");
  EXPECT_EQ(result->status, 401);
  EXPECT_EQ(Error(result)["code"], "unauthenticated");
  client_->set_bearer_token_auth("wrong");
  EXPECT_EQ(client_->Get("/v1/models")->status, 401);
  EXPECT_EQ(Edit({{"prompt", "x", "", ""}})->status, 401);
  client_->set_default_headers({{"Authorization", "bearer secret"}});  // the scheme in any case
  EXPECT_EQ(client_->Get("/v1/models")->status, 200);
  client_->set_default_headers({});
  client_->set_bearer_token_auth("secret");
  result = client_->Get("/v1/models");
  ASSERT_EQ(result->status, 200);
  EXPECT_EQ(nlohmann::json::parse(result->body)["data"][0]["id"], "dray-embedded");
  EXPECT_EQ(Edit({{"prompt", "x", "", ""}, {"steps", "2", "", ""}})->status, 200);
  httplib::Client anyone("127.0.0.1", gateway_->port());
  EXPECT_EQ(anyone.Get("/health")->status, 200);
  httplib::Result page = anyone.Get("/");
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_THAT(page->body, HasSubstr("<title>dray: edit an image</title>"));
  EXPECT_EQ(anyone.Get("/ready")->status, 200);
}

TEST_F(HttpGatewayTest, ReadyFollowsTheWorkers) {
  Serve();
  EXPECT_EQ(client_->Get("/ready")->status, 200);
  backend_.set_health(absl::UnavailableError("worker 1 exited"));
  httplib::Result result = Edit({{"prompt", "x", "", ""}});  // refused: health turns at once
  EXPECT_EQ(result->status, 503);
  EXPECT_THAT(Error(result)["message"].get<std::string>(), HasSubstr("worker 1 exited"));
  EXPECT_EQ(client_->Get("/ready")->status, 503);
  EXPECT_EQ(client_->Get("/health")->status, 200);
}

TEST_F(HttpGatewayTest, StreamsProgressThenTheImage) {
  Serve();
  httplib::Result result = Edit({{"prompt", "x", "", ""}, {"stream", "true", "", ""}});
  ASSERT_EQ(result->status, 200);
  EXPECT_EQ(result->get_header_value("Content-Type"), "text/event-stream");
  const std::string& events = result->body;
  const size_t progress = events.find(
      "event: image_edit.progress\ndata: "
      "{\"step\":2,\"steps\":2,\"type\":\"image_edit.progress\"}");
  const size_t completed = events.find("event: image_edit.completed\ndata: {\"b64_json\":");
  EXPECT_NE(progress, std::string::npos) << events;
  EXPECT_NE(completed, std::string::npos) << events;
  EXPECT_LT(progress, completed);

  result = Edit({{"prompt", "x", "", ""}, {"stream", "true", "", ""}}, "not a picture");
  EXPECT_THAT(result->body,
              HasSubstr("event: error\ndata: {\"error\":{\"code\":\"invalid_argument\""));
}

TEST_F(HttpGatewayTest, MetricsCountRequestsImagesAndWorkers) {
  Serve();
  ASSERT_EQ(Edit({{"prompt", "x", "", ""}, {"n", "2", "", ""}})->status, 200);
  ASSERT_EQ(Edit({{"prompt", "x", "", ""}, {"n", "11", "", ""}})->status, 400);
  httplib::Result result = client_->Get("/metrics");
  ASSERT_EQ(result->status, 200);
  EXPECT_EQ(result->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  const std::string& text = result->body;
  for (const char* sample :
       {R"(dray_serve_requests_total{api="grpc",code="OK",method="EditBatch"} 1)",
        R"(dray_serve_requests_total{api="http",code="200",method="POST /v1/images/edits"} 1)",
        R"(dray_serve_requests_total{api="http",code="400",method="POST /v1/images/edits"} 1)",
        R"(dray_serve_request_seconds_count{api="grpc",method="EditBatch"} 1)",
        R"(dray_serve_images_total{outcome="edited"} 2)", "dray_serve_batch_rows_count 1",
        "dray_serve_batch_rows_sum 2", "dray_serve_queue_images 0", "dray_serve_ready 1",
        "dray_serve_worker_restarts_total 1", R"(dray_worker_resident_bytes{rank="0"} 314572800)",
        R"(dray_worker_device_allocated_bytes{rank="0"} 0)"}) {
    EXPECT_THAT(text, HasSubstr(sample));
  }
  EXPECT_THAT(text, Not(HasSubstr(R"(rank="1")")));  // it has not answered
}

TEST_F(HttpGatewayTest, BodiesAreBounded) {
  HttpOptions options;
  options.max_body_bytes = 4096;
  Serve(options);
  httplib::Result result = Edit({{"prompt", "x", "", ""}}, std::string(8192, 'x'));
  EXPECT_EQ(result->status, 413);
  EXPECT_THAT(Error(result)["message"].get<std::string>(), HasSubstr("larger than 4096 bytes"));
}

TEST_F(HttpGatewayTest, BodiesAreBoundedAsTheyAreReadWhateverTheirFraming) {
  HttpOptions options;
  options.max_body_bytes = 4096;
  Serve(options);
  // Chunks: no length to refuse up front.
  const std::string chunk(1024, 'x');
  httplib::Result result = client_->Post(
      "/v1/images/edits",
      [&](size_t offset, httplib::DataSink& sink) {
        if (offset < 16 * chunk.size()) return sink.write(chunk.data(), chunk.size());
        sink.done();
        return true;
      },
      "application/json");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 413);
  EXPECT_THAT(Error(result)["message"].get<std::string>(), HasSubstr("larger than 4096 bytes"));
}

TEST_F(HttpGatewayTest, WhatNoRouteTakesIsRefusedBeforeItsBodyIsRead) {
  Serve();
  httplib::Result result = client_->Post("/v1/nothing", std::string(100, 'x'), "text/plain");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 404);
  EXPECT_THAT(Error(result)["message"].get<std::string>(), HasSubstr("POST /v1/images/edits"));
  result = client_->Put("/v1/images/edits", "x", "text/plain");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 405);
  result = client_->Get("/%FF%FE");  // not UTF-8, quoted in the error: replaced, never thrown on
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 404);
  EXPECT_EQ(Error(result)["code"], "not_found");
  result = Edit({{"prompt", "x", "", ""}, {"n", "\xff", "", ""}});
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 400);
  EXPECT_EQ(Error(result)["param"], "n");
}

// RawRequest: what the gateway answers `request`, written as is on a socket.
std::string RawRequest(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string answer;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
    char buffer[4096];
    const ssize_t got = read(fd, buffer, sizeof(buffer));  // the status line comes first
    if (got > 0) answer.assign(buffer, got);
  }
  close(fd);
  return answer;
}

TEST_F(HttpGatewayTest, APostWithoutALengthIsRefusedAtOnce) {
  Serve();  // without the check it would read until the client hangs up
  EXPECT_THAT(RawRequest(gateway_->port(), "POST /v1/images/edits HTTP/1.1\r\nHost: x\r\n\r\n"),
              ::testing::StartsWith("HTTP/1.1 411"));
}

TEST_F(HttpGatewayTest, ConnectionsAreBounded) {
  HttpOptions options;
  options.max_connections = 1;
  Serve(options);
  backend_.Hold();
  std::thread held([&] {
    httplib::Client first("127.0.0.1", gateway_->port());
    httplib::MultipartFormDataItems fields = {{"prompt", "x", "", ""},
                                              {"image", Png(), "picture.png", "image/png"}};
    EXPECT_EQ(first.Post("/v1/images/edits", fields)->status, 200);
  });
  backend_.WaitForCalls(1);  // the one connection served is busy
  httplib::Result result = Edit({{"prompt", "x", "", ""}});
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 503);
  EXPECT_THAT(Error(result)["message"].get<std::string>(), HasSubstr("at most 1 connections"));
  result = client_->Get("/health");  // a probe still gets through
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200);
  backend_.Release();
  held.join();
}

}  // namespace
}  // namespace dray
