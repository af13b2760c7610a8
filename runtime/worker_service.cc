#include "runtime/worker_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "dispatch/payload_stream.h"
#include "dispatch/wire.h"
#include "runtime/grpc_util.h"
#include "runtime/session_frames.h"

namespace dray {
namespace {

void SetError(const absl::Status& status, v1::CallResponse* response) {
  response->mutable_error()->set_code(static_cast<int>(status.code()));
  response->mutable_error()->set_message(std::string(status.message()));
}

}  // namespace

v1::CallResponse WorkerServiceImpl::Run(v1::CallRequest& request, std::string* payload) {
  v1::CallResponse response;
  response.set_call_id(request.call_id());
  const std::string what = absl::StrCat("rank ", rank_, ", ", request.method());
  if (request.deadline_unix_ms() != 0 && absl::ToUnixMillis(absl::Now()) > request.deadline_unix_ms()) {
    SetError(absl::DeadlineExceededError(
                 absl::StrCat(what, ": deadline passed before the call could start")),
             &response);
    return response;
  }
  absl::StatusOr<DataProto> input = FromWire(std::move(*request.mutable_input()));
  if (!input.ok()) {
    SetError(absl::InvalidArgumentError(absl::StrCat(what, ": bad input: ", input.status().message())),
             &response);
    return response;
  }
  absl::StatusOr<DataProto> result = host_->Execute(request.role(), request.method(), *input);
  absl::StatusOr<v1::DataProto> encoded =
      result.ok() ? ToWire(*result) : absl::StatusOr<v1::DataProto>(result.status());
  if (!encoded.ok()) {
    SetError(encoded.status(), &response);
    return response;
  }
  *payload = std::move(DetachPayloads({&encoded.value()})[0]);
  *response.mutable_result() = std::move(encoded).value();
  return response;
}

grpc::Status WorkerServiceImpl::Call(grpc::ServerContext*, const v1::CallRequest* request,
                                     v1::CallResponse* response) {
  v1::CallRequest call = *request;
  std::string payload;
  *response = Run(call, &payload);
  if (response->has_result()) *response->mutable_result()->mutable_payload() = std::move(payload);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::Session(
    grpc::ServerContext*,
    grpc::ServerReaderWriter<v1::CallResponseFrame, v1::CallRequestFrame>* stream) {
  v1::CallRequestFrame frame;
  while (stream->Read(&frame)) {
    if (frame.frame_case() != v1::CallRequestFrame::kHeader) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "session: expected a call header, got a payload chunk");
    }
    v1::CallRequest request = std::move(*frame.mutable_header());
    absl::Status read = ReadPayload<v1::CallRequestFrame>(stream, request.mutable_input());
    if (!read.ok()) return ToGrpcStatus(read);
    std::string payload;
    v1::CallResponseFrame response;
    *response.mutable_header() = Run(request, &payload);
    if (!WriteFramed(stream, response, payload)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "session: the controller went away");
    }
  }
  return grpc::Status::OK;
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
