// HttpServer: an HTTP(S) port on cpp-httplib with what dray's HTTP ports
// share (dray serve's, HttpGateway; dray train's dashboard):
//   - each request has a request id (NewRequestId), its x-request-id header;
//   - a route's error is the reply: its status code's HTTP status (400
//     INVALID_ARGUMENT, 401, 404, 413 ..., 429 RESOURCE_EXHAUSTED, 503
//     UNAVAILABLE, 504 DEADLINE_EXCEEDED, 500) with OpenAI's error object and
//     the request id, {"error": {"message", "type", "param", "code",
//     "request_id"}}, "param" naming the field FieldError says; what httplib
//     refuses itself (no route, a body too large or malformed) gets the same;
//   - at most max_connections served at once (one more thread answers the
//     rest with 503 as soon as it can); POST bodies of at most
//     max_body_bytes (413), counted as they are read, whatever their
//     framing (a length, chunks, compression); a POST to no route, a GET
//     with a body and other methods are refused before any body is read;
//   - routes that ask for it need "Authorization: Bearer <token>" (a POST's
//     body is read and dropped before the refusal, for clients that write
//     it all before they read); a POST needs a length or chunks (411);
//   - past max_connections only POSTs are refused: GETs (health, metrics,
//     pages) are quick;
//   - on_request hears of every answered request.
//
//   HttpServer::Options options;
//   options.address = "127.0.0.1:8080";
//   DRAY_ASSIGN_OR_RETURN(auto http, HttpServer::Create(options));
//   http->HandleGet("/health", HttpServer::kOpen, [](const auto&, auto& response, const auto&) {
//     ReplyJson(response, 200, {{"status", "ok"}});
//     return absl::OkStatus();
//   });
//   http->Start();
//
// Thread-safety: HandleGet and HandlePost before Start; then thread-safe.
#ifndef DRAY_RUNTIME_HTTP_HTTP_SERVER_H_
#define DRAY_RUNTIME_HTTP_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "base/request_id.h"
#include "runtime/security/tls.h"

namespace httplib {
class ContentReader;
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace dray {

// FieldError is INVALID_ARGUMENT about request field `field` (the error
// object's "param"); WithField marks any status as about `field`; FieldOf
// reads the field back (empty for other errors).
absl::Status FieldError(absl::string_view field, absl::string_view message);
absl::Status WithField(absl::Status status, absl::string_view field);
std::string FieldOf(const absl::Status& status);

// FormPart: one part of a multipart/form-data body.
struct FormPart {
  std::string name;
  std::string content;
};

// HttpBody: a POST's body as read: its form's parts, or its bytes.
struct HttpBody {
  bool multipart = false;
  std::vector<FormPart> parts;
  std::string bytes;
};

// HttpStatusOf: the HTTP status that says what `code` says.
int HttpStatusOf(absl::StatusCode code);
// ErrorJson: OpenAI's error object for `status`, with its field and request id.
nlohmann::json ErrorJson(const absl::Status& status, const std::string& request_id);
void ReplyJson(httplib::Response& response, int status, const nlohmann::json& body);

class HttpServer {
 public:
  struct Options {
    std::string address = "127.0.0.1:8080";  // host:port; port 0 picks a free one
    // HTTPS when cert is set (with key); clients must show a certificate
    // signed by ca when mutual.
    TlsFiles tls;
    std::string bearer_token;  // what routes kNeedsToken ask for; empty: nothing
    int max_connections = 64;
    int64_t max_body_bytes = int64_t{64} << 20;
    // Hears of every request a route answered: "GET /path", its HTTP status
    // (a stream's: 200, at its start) and how long it took.
    std::function<void(const std::string& route, int status, absl::Duration took)> on_request;
  };
  enum Access { kOpen, kNeedsToken };
  // Handler: a route's work under its request id; an error becomes the reply.
  using Handler = std::function<absl::Status(const httplib::Request&, httplib::Response&,
                                             const std::string& request_id)>;
  // PostHandler: a POST route's work, given its body.
  using PostHandler = std::function<absl::Status(
      const httplib::Request&, HttpBody body, httplib::Response&, const std::string& request_id)>;

  // Create binds the port (UNAVAILABLE if it cannot; INVALID_ARGUMENT for a
  // certificate that does not load).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Create(Options options);
  ~HttpServer();

  // HandleGet serves GET `path` (a regular expression, as httplib's).
  void HandleGet(const std::string& path, Access access, Handler handler);
  // HandlePost serves POST `path` (a literal path), reading the body only
  // for a request that may send it (kNeedsToken: with the token).
  void HandlePost(const std::string& path, Access access, PostHandler handler);
  // Start listens in a thread of its own, and returns once it does.
  void Start();
  int port() const { return port_; }
  // Shutdown stops listening and waits for the requests being answered.
  // Idempotent.
  void Shutdown();

 private:
  explicit HttpServer(Options options);
  absl::Status Bind();
  // Answer runs a route's work under a request id, behind the token when
  // asked, replies its error and tells on_request.
  void Answer(const std::string& route, Access access, const httplib::Request& request,
              httplib::Response& response,
              const std::function<absl::Status(const std::string& request_id)>& work);
  // ReadBody reads a POST's body through `read`, within max_body_bytes
  // (`keep` false: read and dropped); `response` is where cpp-httplib says
  // it stopped a body itself.
  absl::StatusOr<HttpBody> ReadBody(const httplib::Request& request,
                                    const httplib::ContentReader& read,
                                    const httplib::Response& response, bool keep) const;
  // BeforeRouting refuses what no route may read (nullopt: route it).
  std::optional<absl::Status> BeforeRouting(const httplib::Request& request) const;
  absl::Status CheckToken(const httplib::Request& request) const;
  // TooLarge: 413 for a body past max_body_bytes.
  absl::Status TooLarge() const;
  // Refusal: what an error status httplib set itself means.
  absl::Status Refusal(int status, const httplib::Request& request) const;

  const Options options_;
  std::unique_ptr<httplib::Server> server_;
  std::vector<std::string> routes_;      // "GET /path", for a 404's message
  std::vector<std::string> post_paths_;  // the paths a POST may go to
  int port_ = 0;
  std::thread listener_;
  absl::Notification stopped_listening_;
  std::once_flag shutdown_;
};

}  // namespace dray

#endif  // DRAY_RUNTIME_HTTP_HTTP_SERVER_H_
