// The one place where gRPC meets the rest of dray: status conversion both
// ways, the deadline every client call carries, and the channel and server
// settings every dray endpoint shares (message limits, keepalive, errors;
// TLS comes from runtime/security/tls.h).
//
//   grpc::ClientContext context;
//   SetDeadline(&context, absl::Seconds(5));
//   return ToAbslStatus(stub->Heartbeat(&context, request, &response), "heartbeat");
//
// Thread-safety: stateless functions.
#ifndef DRAY_RUNTIME_RPC_GRPC_UTIL_H_
#define DRAY_RUNTIME_RPC_GRPC_UTIL_H_

#include <memory>
#include <string>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dray {

// ToAbslStatus converts a gRPC status, prefixing its message with `what`.
absl::Status ToAbslStatus(const grpc::Status& status, absl::string_view what);

// ToGrpcStatus converts an absl::Status for a gRPC handler to return.
grpc::Status ToGrpcStatus(const absl::Status& status);

// SetDeadline gives `context` a deadline `timeout` from now.
void SetDeadline(grpc::ClientContext* context, absl::Duration timeout);

// CreateDrayChannel opens a channel to `address` (host:port), on TLS after
// UseTls (security/tls.h), with dray's limits: messages up to 2 GiB - 1
// (large payloads stream in chunks anyway) and keepalive pings so a
// vanished peer is noticed within seconds.
std::shared_ptr<grpc::Channel> CreateDrayChannel(const std::string& address);

// CreateExternalChannel opens a channel to a service dray does not run (a
// reward scorer), plaintext or with `credentials` (TLS): the same message
// limits, but no keepalive pings, which other servers refuse as abuse.
std::shared_ptr<grpc::Channel> CreateExternalChannel(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

// ConfigureDrayServer applies the same limits and keepalive to a server.
// It, ConfigureKeepalive and the channel factories keep gRPC initialized
// for the rest of the process, so that it never shuts down and restarts in
// between; the server configurations also keep gRPC's callback completion
// queue, shared by servers with callback methods (health), which gRPC 1.51
// cannot shut down and make again safely.
void ConfigureDrayServer(grpc::ServerBuilder* builder);

// ConfigureKeepalive makes a server ping its clients as dray's channels do
// and accept their pings (dray's clients ping every few seconds, even during
// a long call; gRPC's defaults would answer GOAWAY "too_many_pings").
void ConfigureKeepalive(grpc::ServerBuilder* builder);

// ExplainUnparsableRequests makes a server answer a request it cannot parse
// (malformed protobuf, or a string field that is not valid UTF-8, which
// proto3 refuses) with INVALID_ARGUMENT saying so, instead of gRPC's
// INTERNAL with an empty message.
void ExplainUnparsableRequests(grpc::ServerBuilder* builder);

}  // namespace dray

#endif  // DRAY_RUNTIME_RPC_GRPC_UTIL_H_
