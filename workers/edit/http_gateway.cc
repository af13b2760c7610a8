#include "workers/edit/http_gateway.h"

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "dray/v1/image_edit.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "runtime/rpc/grpc_util.h"
#include "runtime/security/job_secret.h"
#include "workers/edit/edit_page.h"
#include "workers/edit/http_edit_request.h"
#include "workers/edit/image_edit_server.h"

namespace dray {
namespace {

using JsonValue = nlohmann::json;

// ServerSentEvent: one event of a text/event-stream.
std::string ServerSentEvent(const std::string& type, JsonValue data) {
  data["type"] = type;
  return absl::StrCat("event: ", type, "\ndata: ", data.dump(), "\n\n");
}

JsonValue ImageJson(const v1::EditImageResponse& image) {
  return {{"b64_json", absl::Base64Escape(image.image())}, {"seed", image.seed()}};
}

// ServiceStatus: the service's answer, as its client would read it (the
// service's message already ends with the request id).
absl::Status ServiceStatus(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

std::string SizeOf(const v1::EditImageResponse& image) {
  return absl::StrCat(image.width(), "x", image.height());
}

}  // namespace

class HttpGateway::Impl {
 public:
  Impl(std::shared_ptr<grpc::Channel> service, HttpOptions options)
      : options_(std::move(options)),
        edits_(v1::ImageEditService::NewStub(service)),
        health_(grpc::health::v1::Health::NewStub(service)),
        started_(absl::ToUnixSeconds(absl::Now())) {}

  absl::Status Start();
  void Shutdown() {
    if (server_ != nullptr) server_->Shutdown();
  }
  int port() const { return server_->port(); }

 private:
  absl::Status Edits(const httplib::Request& request, HttpBody body, httplib::Response& response,
                     const std::string& request_id);
  // Stream answers a stream=true edit with server-sent events.
  void Stream(HttpEditRequest edit, httplib::Response& response, const std::string& request_id);
  absl::Status Models(httplib::Response& response) const;
  absl::Status Ready(httplib::Response& response);
  // Prepare readies `context` for a call to the service under `request_id`.
  void Prepare(grpc::ClientContext& context, const std::string& request_id,
               absl::Duration timeout) const;

  const HttpOptions options_;
  const std::unique_ptr<v1::ImageEditService::Stub> edits_;
  const std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  const int64_t started_;
  std::unique_ptr<HttpServer> server_;
};

void HttpGateway::Impl::Prepare(grpc::ClientContext& context, const std::string& request_id,
                                absl::Duration timeout) const {
  SetDeadline(&context, timeout);
  context.AddMetadata(kRequestIdMetadata, request_id);
  if (!options_.bearer_token.empty()) AttachBearerToken(&context, options_.bearer_token);
}

absl::Status HttpGateway::Impl::Edits(const httplib::Request& request, HttpBody body,
                                      httplib::Response& response, const std::string& request_id) {
  absl::StatusOr<HttpEditRequest> edit;
  if (body.multipart) {
    edit = ParseEditForm(std::move(body.parts));
  } else if (absl::StartsWith(request.get_header_value("Content-Type"), "application/json")) {
    edit = ParseEditJson(body.bytes);
  } else {
    return absl::InvalidArgumentError(
        "send the fields as multipart/form-data (OpenAI's images.edit) or as application/json");
  }
  DRAY_RETURN_IF_ERROR(edit.status());
  if (!edit->model.empty() && edit->model != options_.model_id) {
    return WithField(
        absl::NotFoundError(absl::StrCat("model '", edit->model, "' is not served here; '",
                                         options_.model_id, "' is (GET /v1/models)")),
        "model");
  }
  if (const int64_t bytes = static_cast<int64_t>(edit->batch.ByteSizeLong());
      bytes > options_.max_call_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("n = ", edit->batch.requests_size(), " copies of the pictures make ", bytes,
                     " bytes, more than the service takes in one call (", options_.max_call_bytes,
                     "): ask for fewer images, or send smaller pictures"));
  }
  if (edit->stream) {
    Stream(*std::move(edit), response, request_id);
    return absl::OkStatus();
  }
  grpc::ClientContext context;
  Prepare(context, request_id, edit->timeout);
  v1::EditImageBatchResponse edited;
  DRAY_RETURN_IF_ERROR(ServiceStatus(edits_->EditBatch(&context, edit->batch, &edited)));
  JsonValue data = JsonValue::array();
  for (const v1::EditImageResponse& image : edited.responses()) data.push_back(ImageJson(image));
  ReplyJson(response, 200,
            {{"created", absl::ToUnixSeconds(absl::Now())},
             {"data", std::move(data)},
             {"size", edited.responses().empty() ? "" : SizeOf(edited.responses(0))},
             {"output_format", "png"}});
  return absl::OkStatus();
}

void HttpGateway::Impl::Stream(HttpEditRequest edit, httplib::Response& response,
                               const std::string& request_id) {
  auto context = std::make_shared<grpc::ClientContext>();
  Prepare(*context, request_id, edit.timeout);
  auto row = std::make_shared<v1::EditImageRequest>(edit.batch.requests(0));
  response.set_header("Cache-Control", "no-cache");
  response.set_chunked_content_provider(
      "text/event-stream", [this, context, row, request_id](size_t, httplib::DataSink& sink) {
        auto send = [&](const std::string& event) {
          if (!sink.write(event.data(), event.size())) context->TryCancel();  // the client left
        };
        std::unique_ptr<grpc::ClientReader<v1::EditImageEvent>> events =
            edits_->EditStream(context.get(), *row);
        v1::EditImageEvent event;
        while (events->Read(&event)) {
          if (event.has_progress()) {
            send(ServerSentEvent("image_edit.progress", {{"step", event.progress().step()},
                                                         {"steps", event.progress().steps()}}));
          } else if (event.has_result()) {
            JsonValue completed = ImageJson(event.result());
            completed["created_at"] = absl::ToUnixSeconds(absl::Now());
            completed["size"] = SizeOf(event.result());
            completed["output_format"] = "png";
            send(ServerSentEvent("image_edit.completed", std::move(completed)));
          }
        }
        const absl::Status status = ServiceStatus(events->Finish());
        if (!status.ok()) send(ServerSentEvent("error", ErrorJson(status, request_id)));
        sink.done();
        return true;
      });
}

absl::Status HttpGateway::Impl::Models(httplib::Response& response) const {
  ReplyJson(response, 200,
            {{"object", "list"},
             {"data", JsonValue::array({{{"id", options_.model_id},
                                         {"object", "model"},
                                         {"created", started_},
                                         {"owned_by", "dray"}}})}});
  return absl::OkStatus();
}

absl::Status HttpGateway::Impl::Ready(httplib::Response& response) {
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(5));
  grpc::health::v1::HealthCheckRequest check;
  check.set_service(kImageEditServiceName);
  grpc::health::v1::HealthCheckResponse health;
  DRAY_RETURN_IF_ERROR(ToAbslStatus(health_->Check(&context, check, &health), "health"));
  if (health.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError("the workers are not serving (restarting, or shutting down)");
  }
  ReplyJson(response, 200, {{"status", "ready"}});
  return absl::OkStatus();
}

absl::Status HttpGateway::Impl::Start() {
  HttpServer::Options http;
  http.address = options_.address;
  http.tls = options_.tls;
  http.bearer_token = options_.bearer_token;
  http.max_connections = options_.max_connections;
  http.max_body_bytes = options_.max_body_bytes;
  if (ServeMetrics* metrics = options_.metrics; metrics != nullptr) {
    http.on_request = [metrics](const std::string& route, int status, absl::Duration took) {
      metrics->Request("http", route, std::to_string(status), took);
    };
  }
  DRAY_ASSIGN_OR_RETURN(server_, HttpServer::Create(std::move(http)));
  server_->HandlePost("/v1/images/edits", HttpServer::kNeedsToken,
                      [this](const auto& request, HttpBody body, auto& response, const auto& id) {
                        return Edits(request, std::move(body), response, id);
                      });
  server_->HandleGet("/v1/models", HttpServer::kNeedsToken,
                     [this](const auto&, auto& response, const auto&) { return Models(response); });
  server_->HandleGet("/", HttpServer::kOpen, [](const auto&, auto& response, const auto&) {
    response.set_content(kEditPage, "text/html; charset=utf-8");
    return absl::OkStatus();
  });
  server_->HandleGet("/health", HttpServer::kOpen, [](const auto&, auto& response, const auto&) {
    ReplyJson(response, 200, {{"status", "ok"}});
    return absl::OkStatus();
  });
  server_->HandleGet("/ready", HttpServer::kOpen,
                     [this](const auto&, auto& response, const auto&) { return Ready(response); });
  if (options_.metrics != nullptr) {
    server_->HandleGet("/metrics", HttpServer::kOpen,
                       [this](const auto&, auto& response, const auto&) {
                         response.set_content(options_.metrics->Render(),
                                              "text/plain; version=0.0.4; charset=utf-8");
                         return absl::OkStatus();
                       });
  }
  server_->Start();
  return absl::OkStatus();
}

HttpGateway::HttpGateway(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpGateway::~HttpGateway() { impl_->Shutdown(); }

absl::StatusOr<std::unique_ptr<HttpGateway>> HttpGateway::Start(
    std::shared_ptr<grpc::Channel> service, HttpOptions options) {
  auto impl = std::make_unique<Impl>(std::move(service), std::move(options));
  DRAY_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<HttpGateway>(new HttpGateway(std::move(impl)));
}

int HttpGateway::port() const { return impl_->port(); }

void HttpGateway::Shutdown() { impl_->Shutdown(); }

}  // namespace dray
