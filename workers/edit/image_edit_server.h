// ImageEditServer: the public ImageEditService (proto/dray/v1/image_edit.proto)
// in front of an EditBackend (an ImageEditController and its workers), with
// grpc.health.v1 and server reflection on the same port.
//
// Requests are checked as they arrive (INVALID_ARGUMENT names what was
// wrong; a request that does not parse, such as a string that is not
// UTF-8, too), then wait in a bounded queue: when it is full a new request gets
// RESOURCE_EXHAUSTED at once. One thread gathers waiting requests that share
// their options into a batch, up to batch_size rows per worker or until the
// oldest has waited max_wait, and sends it as one edit_images_batch call.
// Client deadlines bound both the wait and the call, and a batch whose
// every client has gone (deadline or cancellation) stops between denoising
// steps (EditBackend::CancelRunning). While the backend is
// unhealthy (its workers failed and restart), health is NOT_SERVING and
// requests fail with UNAVAILABLE at once; it turns SERVING again after.
// EditStream relays the batch's denoising steps to its clients as the
// workers report them.
//
//   ServeOptions options;
//   options.address = "127.0.0.1:8000";
//   DRAY_ASSIGN_OR_RETURN(auto server, ImageEditServer::Start(controller.get(), options));
//   ...                // serve until a signal, then
//   server->Shutdown();
//
// Thread-safety: thread-safe.
#ifndef DRAY_WORKERS_EDIT_IMAGE_EDIT_SERVER_H_
#define DRAY_WORKERS_EDIT_IMAGE_EDIT_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "workers/edit/edit_backend.h"
#include "workers/edit/serve_metrics.h"

namespace grpc {
class Channel;
class ServerCredentials;
}  // namespace grpc

namespace dray {

// kImageEditServiceName: the service's full name, as health checks ask for it.
inline constexpr char kImageEditServiceName[] = "dray.v1.ImageEditService";
// kRequestIdMetadata: the initial-metadata key of each request's id, which
// also ends every error message ("[request <id>]") and the server's log line
// of that error. A caller may send its own (16 hex digits, NewRequestId in
// base/request_id.h), as the HTTP gateway does, and the answer keeps it.
inline constexpr char kRequestIdMetadata[] = "dray-request-id";

struct ServeOptions {
  std::string address = "127.0.0.1:8000";            // host:port; port 0 picks a free one
  int max_queue = 64;                                // rows waiting for a batch
  absl::Duration max_wait = absl::Milliseconds(20);  // how long a batch waits to fill
  int64_t max_image_bytes = int64_t{32} << 20;       // larger images: INVALID_ARGUMENT
  // Set: every call must carry "authorization: Bearer <token>"
  // (UNAUTHENTICATED otherwise); grpc.health.v1 stays open.
  std::string bearer_token;
  // The port's security (PublicServerCredentials in security/tls.h: a
  // certificate of its own); unset: the cluster's, DrayServerCredentials().
  std::shared_ptr<grpc::ServerCredentials> credentials;
};

class ImageEditServer {
 public:
  // Start serves until Shutdown; `backend` must outlive the server.
  static absl::StatusOr<std::unique_ptr<ImageEditServer>> Start(EditBackend* backend,
                                                                ServeOptions options);
  ~ImageEditServer();

  // port: where the server listens (the one picked, for port 0).
  int port() const;

  // InProcessChannel reaches the service within this process, past the
  // port's credentials (HttpGateway's way in); the bearer token still holds.
  std::shared_ptr<grpc::Channel> InProcessChannel();

  // metrics: the service's Prometheus metrics (ServeMetrics), shown by the
  // HTTP port at /metrics.
  ServeMetrics& metrics();

  // Drain is a graceful shutdown: admission stops (UNAVAILABLE, health
  // NOT_SERVING), queued and running requests get up to `grace` to finish,
  // then the backend cancels what is left (EditBackend::CancelAll: its
  // clients get UNAVAILABLE), and the server shuts down.
  void Drain(absl::Duration grace);

  // Shutdown stops accepting requests, fails those still queued with
  // UNAVAILABLE and waits for the running batch. Idempotent.
  void Shutdown();

 private:
  class Impl;
  explicit ImageEditServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dray

#endif  // DRAY_WORKERS_EDIT_IMAGE_EDIT_SERVER_H_
