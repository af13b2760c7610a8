// HttpGateway: dray serve's HTTP port, the way people already call image
// models, in front of the ImageEditServer of the same process:
//   POST /v1/images/edits  OpenAI's image edit, multipart or JSON
//                          (HttpEditRequest); {"created", "data": [{"b64_json",
//                          "seed"}], "size", "output_format"}, or with
//                          stream=true server-sent events:
//                          image_edit.progress {step, steps}, then
//                          image_edit.completed {b64_json, seed, ...} or error
//   GET  /v1/models        the model served ({"object": "list", "data": [...]})
//   GET  /health           200 while the process answers (liveness)
//   GET  /ready            200 while the service takes edits, else 503
//   GET  /metrics          Prometheus' text format (ServeMetrics), when given
//   GET  /                 a page to try edits in a browser (kEditPage)
// Each edit goes to ImageEditService over an in-process channel, so HTTP
// requests meet the same admission, queue, budgets and deadlines as gRPC
// ones, under one request id (the x-request-id header, kept by the service).
// A refusal is the gRPC code's HTTP status (400, 401, 404, 413, 429, 503,
// 504, ...) with OpenAI's error object, plus the field and request id:
//   {"error": {"message", "type", "param", "code", "request_id"}}.
// The port is bounded: at most max_connections served at once (one more
// thread answers the rest with 503 at once) and max_body_bytes per body
// (413). /v1/ needs the bearer token when one is set; the page, health and
// metrics do not.
//
//   HttpOptions options;
//   options.address = "127.0.0.1:8080";
//   DRAY_ASSIGN_OR_RETURN(auto http, HttpGateway::Start(server->InProcessChannel(), options));
//
// Thread-safety: thread-safe.
#ifndef DRAY_WORKERS_EDIT_HTTP_GATEWAY_H_
#define DRAY_WORKERS_EDIT_HTTP_GATEWAY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/security/tls.h"
#include "workers/edit/serve_metrics.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace dray {

struct HttpOptions {
  std::string address = "127.0.0.1:8080";  // host:port; port 0 picks a free one
  std::string model_id = "dray-embedded";  // the model /v1/models lists
  std::string bearer_token;                // set: /v1/ asks "Authorization: Bearer <token>"
  // HTTPS when cert is set (with key); clients must show a certificate
  // signed by ca when mutual.
  TlsFiles tls;
  int max_connections = 64;
  int64_t max_body_bytes = int64_t{64} << 20;
  // The most one edit call to the service may carry (its n rows, each with
  // the pictures): more is INVALID_ARGUMENT before the call.
  int64_t max_call_bytes = int64_t{64} << 20;
  // Set (the service's, ImageEditServer::metrics): GET /metrics shows them,
  // with the HTTP requests counted in.
  ServeMetrics* metrics = nullptr;
};

class HttpGateway {
 public:
  // Start serves `service` (ImageEditServer::InProcessChannel) until Shutdown.
  static absl::StatusOr<std::unique_ptr<HttpGateway>> Start(std::shared_ptr<grpc::Channel> service,
                                                            HttpOptions options);
  ~HttpGateway();

  // port: where the gateway listens (the one picked, for port 0).
  int port() const;

  // Shutdown stops listening and waits for the requests being answered.
  // Idempotent.
  void Shutdown();

 private:
  class Impl;
  explicit HttpGateway(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dray

#endif  // DRAY_WORKERS_EDIT_HTTP_GATEWAY_H_
