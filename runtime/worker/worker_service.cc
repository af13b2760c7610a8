#include "runtime/worker/worker_service.h"

#include <grpcpp/support/method_handler.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "dispatch/wire.h"
#include "runtime/rpc/grpc_util.h"
#include "runtime/rpc/session_stream.h"

namespace dray {
namespace {

void SetError(const absl::Status& status, v1::CallResponse* response) {
  response->mutable_error()->set_code(static_cast<int>(status.code()));
  response->mutable_error()->set_message(std::string(status.message()));
}

using RawStream = grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;

// Index of Session among WorkerService's rpcs, in worker.proto's order.
constexpr int kSessionMethodIndex = 1;

}  // namespace

WorkerServiceImpl::WorkerServiceImpl(WorkerHost* host, int rank,
                                     std::function<void(std::string reason)> on_shutdown)
    : host_(host), rank_(rank), on_shutdown_(std::move(on_shutdown)) {
  // Session reads and writes raw byte buffers (session_stream.h): its handler
  // is swapped for one on ByteBuffers, as generated code builds handlers.
  MarkMethodStreamed(kSessionMethodIndex,
                     new grpc::internal::BidiStreamingHandler<WorkerServiceImpl, grpc::ByteBuffer,
                                                              grpc::ByteBuffer>(
                         [](WorkerServiceImpl* self, grpc::ServerContext*, RawStream* stream) {
                           return self->RunSession(stream);
                         },
                         this));
}

v1::CallResponse WorkerServiceImpl::Run(v1::CallRequest& request, ScatteredPayload* payload) {
  v1::CallResponse response;
  response.set_call_id(request.call_id());
  const std::string what = absl::StrCat("rank ", rank_, ", ", request.method());
  if (request.deadline_unix_ms() != 0 &&
      absl::ToUnixMillis(absl::Now()) > request.deadline_unix_ms()) {
    SetError(absl::DeadlineExceededError(
                 absl::StrCat(what, ": deadline passed before the call could start")),
             &response);
    return response;
  }
  absl::StatusOr<DataProto> input = FromWire(std::move(*request.mutable_input()));
  if (!input.ok()) {
    SetError(
        absl::InvalidArgumentError(absl::StrCat(what, ": bad input: ", input.status().message())),
        &response);
    return response;
  }
  absl::StatusOr<DataProto> result = host_->Execute(request.role(), request.method(), *input);
  absl::StatusOr<DetachedWire> encoded =
      result.ok() ? ToDetachedWire(*result) : absl::StatusOr<DetachedWire>(result.status());
  if (!encoded.ok()) {
    SetError(encoded.status(), &response);
    return response;
  }
  *payload = std::move(encoded->payload);
  *response.mutable_result() = std::move(encoded->header);
  return response;
}

grpc::Status WorkerServiceImpl::Call(grpc::ServerContext*, const v1::CallRequest* request,
                                     v1::CallResponse* response) {
  v1::CallRequest call = *request;
  ScatteredPayload payload;
  *response = Run(call, &payload);
  if (response->has_result()) response->mutable_result()->set_payload(payload.Flatten());
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::RunSession(RawStream* stream) {
  while (true) {
    absl::StatusOr<std::optional<v1::CallRequest>> request = ReadCallRequest(stream);
    if (!request.ok()) return ToGrpcStatus(request.status());
    if (!request->has_value()) return grpc::Status::OK;  // the controller closed the session
    ScatteredPayload payload;
    v1::CallResponse response = Run(**request, &payload);
    if (!WriteCallResponse(stream, std::move(response), payload)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "session: the controller went away");
    }
  }
}

grpc::Status WorkerServiceImpl::DescribeMethods(grpc::ServerContext*,
                                                const v1::DescribeMethodsRequest*,
                                                v1::MethodTable* response) {
  *response = host_->Describe();
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::Shutdown(grpc::ServerContext*, const v1::ShutdownRequest* request,
                                         v1::ShutdownResponse*) {
  on_shutdown_(request->reason());
  return grpc::Status::OK;
}

}  // namespace dray
