// The one place where gRPC meets the rest of dray: status conversion both
// ways, the deadline every client call carries, and the channel and server
// settings every dray endpoint shares (message limits, keepalive, errors).
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
#include <grpcpp/security/server_credentials.h>
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

// TlsFiles: PEM files that put every dray port and channel of a process on
// TLS (UseTls). Each process presents `cert`; peers are verified against
// `ca`, the authority that signed every dray process's certificate of the
// job (whose names or IP addresses must be those peers dial).
struct TlsFiles {
  std::string cert;     // this process's certificate (chain)
  std::string key;      // its private key
  std::string ca;       // the authority that signed the peers' certificates
  bool mutual = false;  // servers also require clients to present theirs
};

// UseTls turns TLS on for the rest of the process: CreateDrayChannel and
// DrayServerCredentials use it. It also sets DRAY_TLS_CERT, DRAY_TLS_KEY,
// DRAY_TLS_CA and DRAY_TLS_MUTUAL (absolute paths), which the processes this
// one starts inherit; call it before starting threads. INVALID_ARGUMENT when
// ca is missing or cert comes without key (or key without cert), the
// file's error when one cannot be read. A process without cert and key can
// only be a client, and not of a mutual-TLS server.
absl::Status UseTls(const TlsFiles& files);

// ForgetInheritedTls unsets DRAY_TLS_*, so that a process which chose no TLS
// does not pass a setting from its own environment on to its workers.
void ForgetInheritedTls();

// UseTlsFromEnvironment calls UseTls with DRAY_TLS_* when DRAY_TLS_CA is
// set (a worker of a TLS job), and does nothing otherwise.
absl::Status UseTlsFromEnvironment();

// DrayServerCredentials: TLS after UseTls, plaintext otherwise.
std::shared_ptr<grpc::ServerCredentials> DrayServerCredentials();

// PublicServerCredentials: TLS with a certificate of its own (PEM files) for
// a port the public dials (dray serve's ImageEditService, under a name its
// clients know), whose clients show a token rather than a certificate.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> PublicServerCredentials(
    const std::string& cert_file, const std::string& key_file);

// CreateDrayChannel opens a channel to `address` (host:port), on TLS after
// UseTls, with dray's limits: messages up to 2 GiB - 1
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
