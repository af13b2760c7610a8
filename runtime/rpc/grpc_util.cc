#include "runtime/rpc/grpc_util.h"

#include <chrono>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpc/grpc.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/server_interceptor.h>

#include "absl/strings/str_cat.h"
#include "runtime/security/tls.h"

namespace dray {
namespace {

constexpr int kMaxMessageBytes = std::numeric_limits<int>::max();
constexpr int kKeepaliveTimeMs = 2000;     // ping an idle connection every 2 s
constexpr int kKeepaliveTimeoutMs = 2000;  // and give up 2 s after an unanswered ping

// KeepGrpcInitialized initializes gRPC once for the rest of the process.
// Otherwise gRPC shuts down whenever its last object goes and starts again
// with the next one; when that last object goes on one of gRPC's own threads
// the shutdown runs on a detached thread, which can race the next start or
// the process's exit (an "assertion failed: prior > 0" abort after a test
// binary has passed).
void KeepGrpcInitialized() {
  static const bool initialized = (grpc_init(), true);
  (void)initialized;
}

// KeepCallbackQueue keeps gRPC's callback completion queue for the rest of
// the process. Servers with callback methods (the health service's Watch)
// share that queue: the first such server creates it, the last one's
// destruction shuts it down and joins its threads, and a server started
// meanwhile races that shutdown (gRPC 1.51 aborts with "prior > 0" in
// grpc_cq_internal_unref). A server that never goes, listening nowhere,
// holds the queue, so that it is made once.
void KeepCallbackQueue() {
  static grpc::Server* const keeper = [] {
    static grpc::CallbackGenericService unused;  // answers nothing: there is no port
    grpc::ServerBuilder builder;
    builder.RegisterCallbackGenericService(&unused);
    return builder.BuildAndStart().release();
  }();
  (void)keeper;
}

// UnparsableRequestInterceptor rewrites the status gRPC's protobuf
// deserialization fails a call with (INTERNAL, no message): no handler ever
// answers that way.
class UnparsableRequestInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit UnparsableRequestInterceptor(std::string method) : method_(std::move(method)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      if (status.error_code() == grpc::StatusCode::INTERNAL && status.error_message().empty()) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("cannot parse the request to ", method_,
                         ": it is not valid protobuf, or a string field is not valid UTF-8")));
      }
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
};

class UnparsableRequestInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new UnparsableRequestInterceptor(info->method());
  }
};

}  // namespace

absl::Status ToAbslStatus(const grpc::Status& status, absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
}

std::shared_ptr<grpc::Channel> CreateDrayChannel(const std::string& address) {
  KeepGrpcInitialized();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Each channel gets its own connection: workers must not share one socket.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(address, DrayChannelCredentials(), args);
}

std::shared_ptr<grpc::Channel> CreateExternalChannel(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials) {
  KeepGrpcInitialized();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  return grpc::CreateCustomChannel(
      address, credentials != nullptr ? credentials : grpc::InsecureChannelCredentials(), args);
}

void ConfigureDrayServer(grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder->SetMaxSendMessageSize(kMaxMessageBytes);
  ConfigureKeepalive(builder);
}

void ConfigureKeepalive(grpc::ServerBuilder* builder) {
  KeepGrpcInitialized();
  KeepCallbackQueue();
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
}

void ExplainUnparsableRequests(grpc::ServerBuilder* builder) {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<UnparsableRequestInterceptorFactory>());
  builder->experimental().SetInterceptorCreators(std::move(factories));
}

}  // namespace dray
