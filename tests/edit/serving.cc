#include "tests/edit/serving.h"

#include <string>
#include <utility>

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "dray/v1/image_edit.grpc.pb.h"
#include "runtime/rpc/grpc_util.h"
#include "tests/edit/edit_test_util.h"

namespace dray {

Serving Serve(const ImageEditConfig& config, ServeOptions options,
              ImageEditController::Options controller) {
  Serving serving;
  serving.controller = StartTestController(config, 2, std::move(controller)).value();
  options.address = "127.0.0.1:0";
  serving.server = ImageEditServer::Start(serving.controller.get(), options).value();
  serving.channel = CreateDrayChannel(absl::StrCat("127.0.0.1:", serving.server->port()));
  return serving;
}

ImageEditController::Options QuickHealing(int max_restarts) {
  ImageEditController::Options healing;
  healing.max_restarts = max_restarts;
  healing.restart_backoff = absl::Milliseconds(10);
  healing.stall_timeout = absl::Seconds(2);
  return healing;
}

v1::EditImageRequest Request(int index, int64_t seed) {
  const TestBatch batch = MakeTestBatch(index + 1);
  v1::EditImageRequest request;
  request.set_image(std::string(batch.pngs[index].view()));
  request.set_instruction(batch.instructions[index]);
  request.set_seed(seed);
  return request;
}

absl::StatusOr<v1::EditImageResponse> Edit(const Serving& serving,
                                           const v1::EditImageRequest& request,
                                           absl::Duration timeout) {
  grpc::ClientContext context;
  SetDeadline(&context, timeout);
  v1::EditImageResponse response;
  DRAY_RETURN_IF_ERROR(ToAbslStatus(
      v1::ImageEditService::NewStub(serving.channel)->Edit(&context, request, &response), "Edit"));
  return response;
}

absl::StatusOr<v1::EditImageBatchResponse> EditBatch(const Serving& serving,
                                                     const v1::EditImageBatchRequest& request) {
  grpc::ClientContext context;
  SetDeadline(&context, absl::Minutes(2));
  v1::EditImageBatchResponse response;
  DRAY_RETURN_IF_ERROR(ToAbslStatus(
      v1::ImageEditService::NewStub(serving.channel)->EditBatch(&context, request, &response),
      "EditBatch"));
  return response;
}

}  // namespace dray
