// TLS for dray's endpoints: the process-wide setting that puts every
// internal port and channel on TLS (UseTls, inherited by the processes it
// starts through DRAY_TLS_*), and the gRPC credentials that follow from it;
// plus the credentials of a public port with a certificate of its own.
//
//   DRAY_RETURN_IF_ERROR(UseTls({"node.pem", "node.key", "ca.pem"}));
//   builder.AddListeningPort(address, DrayServerCredentials());
//
// Thread-safety: UseTls and ForgetInheritedTls change the environment: call
// them before starting threads; the credentials functions are thread-safe.
#ifndef DRAY_RUNTIME_SECURITY_TLS_H_
#define DRAY_RUNTIME_SECURITY_TLS_H_

#include <memory>
#include <string>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dray {

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

// DrayServerCredentials and DrayChannelCredentials: TLS after UseTls,
// plaintext otherwise.
std::shared_ptr<grpc::ServerCredentials> DrayServerCredentials();
std::shared_ptr<grpc::ChannelCredentials> DrayChannelCredentials();

// PublicServerCredentials: TLS with a certificate of its own (PEM files) for
// a port the public dials (dray serve's ImageEditService, under a name its
// clients know), whose clients show a token rather than a certificate.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> PublicServerCredentials(
    const std::string& cert_file, const std::string& key_file);

}  // namespace dray

#endif  // DRAY_RUNTIME_SECURITY_TLS_H_
