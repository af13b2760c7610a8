#include "runtime/http/http_server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "runtime/security/job_secret.h"

namespace dray {
namespace {

constexpr char kFieldPayload[] = "type.dray.dev/http-field";
constexpr char kHttpStatusPayload[] = "type.dray.dev/http-status";

// WithHttpStatus: `status`, replied with HTTP status `http_status` rather than its code's.
absl::Status WithHttpStatus(absl::Status status, int http_status) {
  status.SetPayload(kHttpStatusPayload, absl::Cord(std::to_string(http_status)));
  return status;
}

void ReplyError(httplib::Response& response, const absl::Status& status,
                const std::string& request_id) {
  int http_status = HttpStatusOf(status.code());
  if (const auto given = status.GetPayload(kHttpStatusPayload); given.has_value()) {
    absl::SimpleAtoi(std::string(*given), &http_status);
  }
  ReplyJson(response, http_status, ErrorJson(status, request_id));
}

// Refuse replies `status` to a request that reached no route, under a new
// request id.
void Refuse(httplib::Response& response, const absl::Status& status) {
  const std::string request_id = NewRequestId();
  response.set_header("x-request-id", request_id);
  ReplyError(response, status, request_id);
}

// ConnectionQueue: httplib's task queue, serving at most `limit`
// connections at once; one more thread answers the rest at once, each with
// Refusing() true for its pre-routing handler.
class ConnectionQueue final : public httplib::TaskQueue {
 public:
  // What enqueue returns: void up to httplib 0.14 (Debian 12's 0.11), then
  // whether the task was taken (Debian 13's 0.18). Every task is taken.
  using Taken =
      decltype(std::declval<httplib::TaskQueue&>().enqueue(std::declval<std::function<void()>>()));

  explicit ConnectionQueue(int limit) : limit_(limit), pool_(limit), refuser_(1) {}

  Taken enqueue(std::function<void()> connection) override {
    if (open_.fetch_add(1) >= limit_) {
      refuser_.enqueue([this, connection = std::move(connection)] {
        refusing_ = true;
        connection();
        refusing_ = false;
        --open_;
      });
    } else {
      pool_.enqueue([this, connection = std::move(connection)] {
        connection();
        --open_;
      });
    }
    return static_cast<Taken>(true);
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

absl::Status FieldError(absl::string_view field, absl::string_view message) {
  return WithField(absl::InvalidArgumentError(absl::StrCat(field, ": ", message)), field);
}

absl::Status WithField(absl::Status status, absl::string_view field) {
  status.SetPayload(kFieldPayload, absl::Cord(field));
  return status;
}

std::string FieldOf(const absl::Status& status) {
  const auto field = status.GetPayload(kFieldPayload);
  return field.has_value() ? std::string(*field) : std::string();
}

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

nlohmann::json ErrorJson(const absl::Status& status, const std::string& request_id) {
  const std::string field = FieldOf(status);
  std::string code = absl::StatusCodeToString(status.code());
  absl::AsciiStrToLower(&code);
  return {{"error",
           {{"message", std::string(status.message())},
            {"type", HttpStatusOf(status.code()) < 500 ? "invalid_request_error" : "server_error"},
            {"param", field.empty() ? nlohmann::json(nullptr) : nlohmann::json(field)},
            {"code", code},
            {"request_id", request_id}}}};
}

void ReplyJson(httplib::Response& response, int status, const nlohmann::json& body) {
  response.status = status;
  // Text that is not UTF-8 (a client's, quoted in an error) is replaced, never thrown on.
  response.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                       "application/json");
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(Options options) {
  if (options.max_connections < 1 || options.max_body_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("an HTTP port serves at least 1 connection (not ", options.max_connections,
                     ") and bodies of 0 bytes or more (not ", options.max_body_bytes, ")"));
  }
  std::unique_ptr<HttpServer> server(new HttpServer(std::move(options)));
  DRAY_RETURN_IF_ERROR(server->Bind());
  return server;
}

HttpServer::HttpServer(Options options) : options_(std::move(options)) {}

HttpServer::~HttpServer() { Shutdown(); }

absl::Status HttpServer::Bind() {
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
  server_->set_pre_routing_handler([this, limit](const httplib::Request& request,
                                                 httplib::Response& response) {
    // Past the bound only POSTs (edits) are refused: the rest is quick, and
    // a health probe or a scrape must not fail for a busy port.
    if (ConnectionQueue::Refusing() && request.method == "POST") {
      Refuse(response, absl::UnavailableError(absl::StrCat("the HTTP port serves at most ", limit,
                                                           " connections at once; retry later")));
      return httplib::Server::HandlerResponse::Handled;
    }
    const std::optional<absl::Status> refused = BeforeRouting(request);
    if (!refused.has_value()) return httplib::Server::HandlerResponse::Unhandled;
    Refuse(response, *refused);
    return httplib::Server::HandlerResponse::Handled;
  });
  server_->set_exception_handler(
      [](const httplib::Request&, httplib::Response& response, std::exception_ptr) {
        Refuse(response, absl::InternalError("the server failed to answer this request"));
      });
  server_->set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& request, httplib::Response& response) {
        if (!response.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        Refuse(response, WithHttpStatus(Refusal(response.status, request), response.status));
        return httplib::Server::HandlerResponse::Handled;
      }));
  const auto& [host, port] = address;
  port_ =
      port == 0 ? server_->bind_to_any_port(host) : (server_->bind_to_port(host, port) ? port : -1);
  if (port_ <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve HTTP on ", options_.address, " (in use, or not an address)"));
  }
  return absl::OkStatus();
}

void HttpServer::Answer(const std::string& route, Access access, const httplib::Request& request,
                        httplib::Response& response,
                        const std::function<absl::Status(const std::string&)>& work) {
  const absl::Time start = absl::Now();
  const std::string request_id = NewRequestId();
  response.set_header("x-request-id", request_id);
  absl::Status status = access == kNeedsToken ? CheckToken(request) : absl::OkStatus();
  if (status.ok()) status = work(request_id);
  if (!status.ok()) {
    Log("http", absl::StrCat("request ", request_id, " (", route, "): ",
                             absl::StatusCodeToString(status.code()), ": ", status.message()));
    ReplyError(response, status, request_id);
  }
  if (options_.on_request) {
    options_.on_request(route, response.status == -1 ? 200 : response.status, absl::Now() - start);
  }
}

void HttpServer::HandleGet(const std::string& path, Access access, Handler handler) {
  const std::string route = absl::StrCat("GET ", path);
  routes_.push_back(route);
  server_->Get(path, [this, route, access, handler = std::move(handler)](
                         const httplib::Request& request, httplib::Response& response) {
    Answer(route, access, request, response,
           [&](const std::string& request_id) { return handler(request, response, request_id); });
  });
}

void HttpServer::HandlePost(const std::string& path, Access access, PostHandler handler) {
  const std::string route = absl::StrCat("POST ", path);
  routes_.push_back(route);
  post_paths_.push_back(path);
  server_->Post(path, [this, route, access, handler = std::move(handler)](
                          const httplib::Request& request, httplib::Response& response,
                          const httplib::ContentReader& read) {
    Answer(route, kOpen, request, response, [&](const std::string& request_id) -> absl::Status {
      if (absl::Status token = access == kNeedsToken ? CheckToken(request) : absl::OkStatus();
          !token.ok()) {
        // Read on (and dropped), within the bound: a client that writes its
        // whole body before it reads sees the refusal, not a broken pipe.
        ReadBody(request, read, response, /*keep=*/false).IgnoreError();
        return token;
      }
      DRAY_ASSIGN_OR_RETURN(HttpBody body, ReadBody(request, read, response, /*keep=*/true));
      return handler(request, std::move(body), response, request_id);
    });
  });
}

absl::StatusOr<HttpBody> HttpServer::ReadBody(const httplib::Request& request,
                                              const httplib::ContentReader& read,
                                              const httplib::Response& response, bool keep) const {
  int64_t length = 0;  // the length it announces, if it does
  if (absl::SimpleAtoi(request.get_header_value("Content-Length"), &length) &&
      length > options_.max_body_bytes) {
    return TooLarge();
  }
  HttpBody body;
  int64_t bytes = 0;
  // Counts every byte as it arrives, whatever the framing: false past the bound.
  auto counted = [&](std::string& into) {
    return [&bytes, &into, keep, this](const char* data, size_t size) {
      bytes += static_cast<int64_t>(size);
      if (bytes > options_.max_body_bytes) return false;
      if (keep) into.append(data, size);
      return true;
    };
  };
  bool read_through;
  if (request.is_multipart_form_data()) {
    body.multipart = true;
    read_through = read(
        [&](const httplib::MultipartFormData& part) {
          body.parts.push_back({part.name, ""});
          return true;
        },
        [&](const char* data, size_t size) {
          return counted(body.parts.back().content)(data, size);
        });
  } else {
    read_through = read(counted(body.bytes));
  }
  // cpp-httplib 0.18.7-1+deb13u1 (Debian 13) stops a chunked body at the
  // payload bound itself, before the bytes past it reach `counted`, and
  // says so in the response's status.
  if (bytes > options_.max_body_bytes || response.status == 413) return TooLarge();
  if (!read_through) {
    return absl::InvalidArgumentError("the body could not be read (a malformed multipart body?)");
  }
  return body;
}

std::optional<absl::Status> HttpServer::BeforeRouting(const httplib::Request& request) const {
  const std::string length = request.get_header_value("Content-Length");
  const bool has_body =
      request.has_header("Transfer-Encoding") || (!length.empty() && length != "0");
  if (request.method == "POST") {
    if (!absl::c_linear_search(post_paths_, request.path)) return Refusal(404, request);
    if (length.empty() && !request.has_header("Transfer-Encoding")) {  // read until it hangs up
      return WithHttpStatus(absl::InvalidArgumentError("send the body with a Content-Length, or "
                                                       "in chunks (Transfer-Encoding: chunked)"),
                            411);
    }
    return std::nullopt;
  }
  if (request.method == "GET" || request.method == "HEAD") {
    if (!has_body) return std::nullopt;
    return absl::InvalidArgumentError(absl::StrCat(request.method, " takes no body"));
  }
  return WithHttpStatus(
      absl::InvalidArgumentError(
          absl::StrCat(request.method, " is not served here (", absl::StrJoin(routes_, ", "), ")")),
      405);
}

absl::Status HttpServer::TooLarge() const {
  return WithHttpStatus(absl::ResourceExhaustedError(absl::StrCat(
                            "the body is larger than ", options_.max_body_bytes, " bytes")),
                        413);
}

absl::Status HttpServer::CheckToken(const httplib::Request& request) const {
  if (options_.bearer_token.empty()) return absl::OkStatus();
  const std::string header = request.get_header_value("Authorization");
  absl::string_view shown = header;
  if (absl::ConsumePrefix(&shown, "Bearer ") || absl::ConsumePrefix(&shown, "bearer ")) {
    if (ShowsSecret(shown, options_.bearer_token)) return absl::OkStatus();
  }
  return absl::UnauthenticatedError(
      "this service needs a client token: send the header 'Authorization: Bearer TOKEN'");
}

absl::Status HttpServer::Refusal(int status, const httplib::Request& request) const {
  switch (status) {
    case 404:
      return absl::NotFoundError(absl::StrCat("no ", request.method, " ", request.path, " here (",
                                              absl::StrJoin(routes_, ", "), ")"));
    case 413:
      return TooLarge();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("HTTP ", status, ": the request could not be read (a malformed body?)"));
  }
}

void HttpServer::Start() {
  listener_ = std::thread([this] {
    server_->listen_after_bind();
    stopped_listening_.Notify();
  });
  // Shutdown stops only a running server: wait until it runs (or failed).
  while (!server_->is_running() &&
         !stopped_listening_.WaitForNotificationWithTimeout(absl::Milliseconds(1))) {
  }
}

void HttpServer::Shutdown() {
  std::call_once(shutdown_, [this] {
    if (server_ == nullptr) return;
    server_->stop();
    if (listener_.joinable()) listener_.join();
  });
}

}  // namespace dray
