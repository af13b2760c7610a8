// The job secret: a random token the controller makes for each worker group
// and gives its workers on their standard input (never on a command line or
// in the environment, which other tools read), and that every internal RPC
// (WorkerService, ControllerService) carries as metadata. A call without
// it, or with another, is UNAUTHENTICATED: a local process that finds the
// ports cannot drive the workers. grpc.health.v1 stays open.
//
//   const std::string secret = NewJobSecret();               // controller
//   AttachJobSecret(&context, secret);                        // any client
//   DRAY_RETURN_IF_ERROR(CheckJobSecret(*server_context, secret));  // servers
//
// Thread-safety: stateless functions.
#ifndef DRAY_RUNTIME_SECURITY_JOB_SECRET_H_
#define DRAY_RUNTIME_SECURITY_JOB_SECRET_H_

#include <string>

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dray {

// kJobSecretMetadata: the metadata key that carries the secret.
inline constexpr char kJobSecretMetadata[] = "dray-job-secret";

// NewJobSecret returns 32 random bytes from the kernel, as 64 hex digits.
std::string NewJobSecret();

// ReadJobSecret reads the secret from `fd` (a worker's standard input) up to
// its end; INVALID_ARGUMENT when there is none.
absl::StatusOr<std::string> ReadJobSecret(int fd);

// ReadSecretFile reads a token that the operator keeps in a file (a cluster
// token, a Kubernetes Secret mounted as a file), without surrounding white
// space; INVALID_ARGUMENT when the file holds none, and the file's own
// error when it cannot be read.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path);

// AttachBearerToken adds `authorization: Bearer <token>` to a call's
// metadata, as public services (and scorers) expect a client's token.
void AttachBearerToken(grpc::ClientContext* context, absl::string_view token);

// CheckBearerToken is OK when the call carries `authorization: Bearer
// <token>`, else UNAUTHENTICATED; constant-time as CheckJobSecret.
absl::Status CheckBearerToken(const grpc::ServerContextBase& context, absl::string_view token);

// AttachJobSecret adds the secret to a call's metadata.
void AttachJobSecret(grpc::ClientContext* context, absl::string_view secret);

// CheckJobSecret is OK when the call carries `secret`, else UNAUTHENTICATED.
// The comparison takes the same time wherever the values differ.
absl::Status CheckJobSecret(const grpc::ServerContextBase& context, absl::string_view secret);

// ShowsSecret: whether `shown` is `secret` (a peer's answer on a socket that
// is not gRPC), compared in the same time wherever they differ.
bool ShowsSecret(absl::string_view shown, absl::string_view secret);

}  // namespace dray

#endif  // DRAY_RUNTIME_SECURITY_JOB_SECRET_H_
