// Shared pieces of the end-to-end ImageEditService tests: a server over two
// real `dray worker` processes, requests to it as clients send them, and a
// watch on its health.
#ifndef DRAY_TESTS_EDIT_SERVING_H_
#define DRAY_TESTS_EDIT_SERVING_H_

#include <cstdint>
#include <memory>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/support/sync_stream.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dray/v1/image_edit.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "runtime/rpc/grpc_util.h"
#include "workers/edit/image_edit_controller.h"
#include "workers/edit/image_edit_server.h"
#include "workers/pipeline/edit_config.h"

namespace dray {

// Serving: a controller with two workers and a server in front of it.
struct Serving {
  std::unique_ptr<ImageEditController> controller;
  std::unique_ptr<ImageEditServer> server;
  std::shared_ptr<grpc::Channel> channel;
};

// Serve starts a Serving on a free local port.
Serving Serve(const ImageEditConfig& config, ServeOptions options = {},
              ImageEditController::Options controller = {});

// QuickHealing: controller options that notice a stalled worker within 2 s
// and restart a failed group after 10 ms (doubling), up to `max_restarts`.
ImageEditController::Options QuickHealing(int max_restarts);

// Request: test image `index` (MakeTestBatch) with its instruction and `seed`.
v1::EditImageRequest Request(int index, int64_t seed);

// Edit sends `request` as an Edit call with a deadline `timeout` from now.
absl::StatusOr<v1::EditImageResponse> Edit(const Serving& serving,
                                           const v1::EditImageRequest& request,
                                           absl::Duration timeout = absl::Minutes(2));

// EditBatch sends `request` as an EditBatch call with a two-minute deadline.
absl::StatusOr<v1::EditImageBatchResponse> EditBatch(const Serving& serving,
                                                     const v1::EditImageBatchRequest& request);

// HealthWatch: the service's standard health Watch stream, opened before
// the test causes a change, so that no change goes unseen.
class HealthWatch {
 public:
  explicit HealthWatch(const Serving& serving) {
    SetDeadline(&context_, absl::Minutes(2));
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(kImageEditServiceName);
    updates_ = grpc::health::v1::Health::NewStub(serving.channel)->Watch(&context_, request);
  }
  ~HealthWatch() { context_.TryCancel(); }

  // WaitFor reads updates until the service reports `wanted`; false if the
  // stream ends first.
  bool WaitFor(grpc::health::v1::HealthCheckResponse::ServingStatus wanted) {
    grpc::health::v1::HealthCheckResponse update;
    while (updates_->Read(&update)) {
      if (update.status() == wanted) return true;
    }
    return false;
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<grpc::health::v1::HealthCheckResponse>> updates_;
};

}  // namespace dray

#endif  // DRAY_TESTS_EDIT_SERVING_H_
