#include "workers/edit/http_gateway.h"

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/log.h"
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

// HttpStatusOf: the HTTP status that says what `code` says.
int HttpStatusOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;  // the client closed the request (nginx's)
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

// ErrorJson: OpenAI's error object for `status`, with its field and request id.
JsonValue ErrorJson(const absl::Status& status, const std::string& request_id) {
  const std::string field = FieldOf(status);
  std::string code = absl::StatusCodeToString(status.code());
  absl::AsciiStrToLower(&code);
  return {{"error",
           {{"message", std::string(status.message())},
            {"type", HttpStatusOf(status.code()) < 500 ? "invalid_request_error" : "server_error"},
            {"param", field.empty() ? JsonValue(nullptr) : JsonValue(field)},
            {"code", code},
            {"request_id", request_id}}}};
}

void ReplyJson(httplib::Response& response, int status, const JsonValue& body) {
  response.status = status;
  response.set_content(body.dump(), "application/json");
}

void ReplyError(httplib::Response& response, const absl::Status& status,
                const std::string& request_id) {
  ReplyJson(response, HttpStatusOf(status.code()), ErrorJson(status, request_id));
}

// Refuse replies `status` to a request that reached no route, under a new
// request id; `http_status` overrides the code's.
void Refuse(httplib::Response& response, const absl::Status& status, int http_status = 0) {
  const std::string request_id = NewRequestId();
  response.set_header("x-request-id", request_id);
  ReplyError(response, status, request_id);
  if (http_status != 0) response.status = http_status;
}

// ServerSentEvent: one event of a text/event-stream.
std::string ServerSentEvent(const std::string& type, JsonValue data) {
  data["type"] = type;
  return absl::StrCat("event: ", type, "\ndata: ", data.dump(), "\n\n");
}

JsonValue ImageJson(const v1::EditImageResponse& image) {
  return {{"b64_json", absl::Base64Escape(image.image())}, {"seed", image.seed()}};
}

std::string SizeOf(const v1::EditImageResponse& image) {
  return absl::StrCat(image.width(), "x", image.height());
}

// ConnectionQueue: httplib's task queue, serving at most `limit`
// connections at once; one more thread answers the rest at once, each with
// Refusing() true for its pre-routing handler.
class ConnectionQueue final : public httplib::TaskQueue {
 public:
  explicit ConnectionQueue(int limit) : limit_(limit), pool_(limit), refuser_(1) {}

  void enqueue(std::function<void()> connection) override {
    if (open_.fetch_add(1) >= limit_) {
      refuser_.enqueue([this, connection = std::move(connection)] {
        refusing_ = true;
        connection();
        refusing_ = false;
        --open_;
      });
      return;
    }
    pool_.enqueue([this, connection = std::move(connection)] {
      connection();
      --open_;
    });
  }
  void shutdown() override {
    pool_.shutdown();
    refuser_.shutdown();
  }

  static bool Refusing() { return refusing_; }

 private:
  static thread_local bool refusing_;
  const int limit_;
  std::atomic<int> open_{0};
  httplib::ThreadPool pool_, refuser_;
};

thread_local bool ConnectionQueue::refusing_ = false;

// SplitAddress reads "host:port".
absl::StatusOr<std::pair<std::string, int>> SplitAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not HOST:PORT"));
  }
  return std::pair{address.substr(0, colon), port};
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
  void Shutdown();
  int port() const { return port_; }

 private:
  // Handler: a route's work, given its request id; an error becomes the reply.
  using Handler = std::function<absl::Status(const httplib::Request&, httplib::Response&,
                                             const std::string& request_id)>;
  // Handle serves `method` (GET or POST) on `path` by `handler`, under a
  // request id, behind the token when `needs_token`, counted in the metrics.
  void Handle(const std::string& method, const std::string& path, bool needs_token,
              Handler handler);
  absl::Status CheckToken(const httplib::Request& request) const;

  absl::Status Edits(const httplib::Request& request, httplib::Response& response,
                     const std::string& request_id);
  // Stream answers a stream=true edit with server-sent events.
  void Stream(HttpEditRequest edit, const httplib::Request& request, httplib::Response& response,
              const std::string& request_id);
  absl::Status Models(httplib::Response& response) const;
  absl::Status Ready(httplib::Response& response);
  // HttplibRefusal: what an error status httplib set itself means.
  absl::Status HttplibRefusal(int status, const httplib::Request& request) const;
  // Prepare readies `context` for a call to the service on behalf of `request`.
  void Prepare(grpc::ClientContext& context, const httplib::Request& request,
               const std::string& request_id, absl::Duration timeout) const;

  const HttpOptions options_;
  const std::unique_ptr<v1::ImageEditService::Stub> edits_;
  const std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  const int64_t started_;
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  std::thread listener_;
  std::once_flag shutdown_;
};

void HttpGateway::Impl::Handle(const std::string& method, const std::string& path, bool needs_token,
                               Handler handler) {
  const std::string route = absl::StrCat(method, " ", path);
  auto serve = [this, route, needs_token, handler = std::move(handler)](
                   const httplib::Request& request, httplib::Response& response) {
    const absl::Time start = absl::Now();
    const std::string request_id = NewRequestId();
    response.set_header("x-request-id", request_id);
    absl::Status status = needs_token ? CheckToken(request) : absl::OkStatus();
    if (status.ok()) status = handler(request, response, request_id);
    if (!status.ok()) {
      Log("http", absl::StrCat("request ", request_id, " (", route, "): ", status.ToString()));
      ReplyError(response, status, request_id);
    }
    if (options_.metrics != nullptr) {
      const int code = response.status == -1 ? 200 : response.status;  // a stream's is set later
      options_.metrics->Request("http", route, std::to_string(code), absl::Now() - start);
    }
  };
  if (method == "GET") {
    server_->Get(path, std::move(serve));
  } else {
    server_->Post(path, std::move(serve));
  }
}

absl::Status HttpGateway::Impl::CheckToken(const httplib::Request& request) const {
  if (options_.bearer_token.empty() ||
      ShowsSecret(request.get_header_value("Authorization"),
                  absl::StrCat("Bearer ", options_.bearer_token))) {
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError(
      "this service needs a client token: send the header 'Authorization: Bearer TOKEN'");
}

void HttpGateway::Impl::Prepare(grpc::ClientContext& context, const httplib::Request& request,
                                const std::string& request_id, absl::Duration timeout) const {
  SetDeadline(&context, timeout);
  context.AddMetadata(kRequestIdMetadata, request_id);
  if (!options_.bearer_token.empty()) AttachBearerToken(&context, options_.bearer_token);
}

absl::Status HttpGateway::Impl::Edits(const httplib::Request& request, httplib::Response& response,
                                      const std::string& request_id) {
  absl::StatusOr<HttpEditRequest> edit;
  if (request.is_multipart_form_data()) {
    std::vector<FormPart> parts;
    for (const auto& [name, file] : request.files) parts.push_back({name, file.content});
    edit = ParseEditForm(std::move(parts));
  } else if (absl::StartsWith(request.get_header_value("Content-Type"), "application/json")) {
    edit = ParseEditJson(request.body);
  } else {
    return absl::InvalidArgumentError(
        "send the fields as multipart/form-data (OpenAI's images.edit) or as application/json");
  }
  DRAY_RETURN_IF_ERROR(edit.status());
  if (!edit->model.empty() && edit->model != options_.model_id) {
    return absl::NotFoundError(absl::StrCat("model '", edit->model, "' is not served here; '",
                                            options_.model_id, "' is (GET /v1/models)"));
  }
  if (edit->stream) {
    Stream(*std::move(edit), request, response, request_id);
    return absl::OkStatus();
  }
  grpc::ClientContext context;
  Prepare(context, request, request_id, edit->timeout);
  v1::EditImageBatchResponse edited;
  DRAY_RETURN_IF_ERROR(
      ToAbslStatus(edits_->EditBatch(&context, edit->batch, &edited), "ImageEditService"));
  JsonValue data = JsonValue::array();
  for (const v1::EditImageResponse& image : edited.responses()) data.push_back(ImageJson(image));
  ReplyJson(response, 200,
            {{"created", absl::ToUnixSeconds(absl::Now())},
             {"data", std::move(data)},
             {"size", edited.responses().empty() ? "" : SizeOf(edited.responses(0))},
             {"output_format", "png"}});
  return absl::OkStatus();
}

void HttpGateway::Impl::Stream(HttpEditRequest edit, const httplib::Request& request,
                               httplib::Response& response, const std::string& request_id) {
  auto context = std::make_shared<grpc::ClientContext>();
  Prepare(*context, request, request_id, edit.timeout);
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
        const absl::Status status = ToAbslStatus(events->Finish(), "ImageEditService");
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

absl::Status HttpGateway::Impl::HttplibRefusal(int status, const httplib::Request& request) const {
  switch (status) {
    case 404:
      return absl::NotFoundError(absl::StrCat(
          "no ", request.method, " ", request.path,
          " here (POST /v1/images/edits, GET /, /v1/models, /health, /ready, /metrics)"));
    case 413:
      return absl::ResourceExhaustedError(
          absl::StrCat("the body is larger than ", options_.max_body_bytes, " bytes"));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("HTTP ", status, ": the request could not be read (a malformed body?)"));
  }
}

absl::Status HttpGateway::Impl::Start() {
  DRAY_ASSIGN_OR_RETURN(const auto address, SplitAddress(options_.address));
  const TlsFiles& tls = options_.tls;
  if (tls.cert.empty()) {
    server_ = std::make_unique<httplib::Server>();
  } else {
    server_ = std::make_unique<httplib::SSLServer>(tls.cert.c_str(), tls.key.c_str(),
                                                   tls.mutual ? tls.ca.c_str() : nullptr);
  }
  if (!server_->is_valid()) {
    return absl::InvalidArgumentError(absl::StrCat("HTTPS cannot start with certificate '",
                                                   tls.cert, "' and key '", tls.key, "'"));
  }
  const int limit = options_.max_connections;
  server_->new_task_queue = [limit] { return new ConnectionQueue(limit); };
  server_->set_payload_max_length(static_cast<size_t>(options_.max_body_bytes));
  server_->set_read_timeout(std::chrono::seconds(30));
  server_->set_pre_routing_handler([limit](const httplib::Request&, httplib::Response& response) {
    if (!ConnectionQueue::Refusing()) return httplib::Server::HandlerResponse::Unhandled;
    response.set_header("Connection", "close");
    Refuse(response, absl::UnavailableError(absl::StrCat("the HTTP port serves at most ", limit,
                                                         " connections at once; retry later")));
    return httplib::Server::HandlerResponse::Handled;
  });
  // What httplib refuses itself (no route, a body too large or malformed)
  // gets a JSON error too.
  server_->set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& request, httplib::Response& response) {
        if (!response.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        Refuse(response, HttplibRefusal(response.status, request), response.status);
        return httplib::Server::HandlerResponse::Handled;
      }));
  Handle("POST", "/v1/images/edits", true,
         [this](const auto& request, auto& response, const auto& id) {
           return Edits(request, response, id);
         });
  Handle("GET", "/v1/models", true,
         [this](const auto&, auto& response, const auto&) { return Models(response); });
  Handle("GET", "/health", false, [](const auto&, auto& response, const auto&) {
    ReplyJson(response, 200, {{"status", "ok"}});
    return absl::OkStatus();
  });
  Handle("GET", "/", false, [](const auto&, auto& response, const auto&) {
    response.set_content(kEditPage, "text/html; charset=utf-8");
    return absl::OkStatus();
  });
  Handle("GET", "/ready", false,
         [this](const auto&, auto& response, const auto&) { return Ready(response); });
  if (options_.metrics != nullptr) {
    Handle("GET", "/metrics", false, [this](const auto&, auto& response, const auto&) {
      response.set_content(options_.metrics->Render(), "text/plain; version=0.0.4; charset=utf-8");
      return absl::OkStatus();
    });
  }
  const auto& [host, port] = address;
  port_ =
      port == 0 ? server_->bind_to_any_port(host) : (server_->bind_to_port(host, port) ? port : -1);
  if (port_ <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve HTTP on ", options_.address, " (in use, or not an address)"));
  }
  listener_ = std::thread([this] { server_->listen_after_bind(); });
  return absl::OkStatus();
}

void HttpGateway::Impl::Shutdown() {
  std::call_once(shutdown_, [this] {
    if (server_ == nullptr) return;
    server_->stop();
    if (listener_.joinable()) listener_.join();
  });
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
