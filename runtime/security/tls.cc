#include "runtime/security/tls.h"

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "base/files.h"
#include "base/status_macros.h"

namespace dray {
namespace {

// Tls: the process's TLS settings once UseTls ran.
struct Tls {
  std::string cert, key, ca;
  bool mutual = false;
};
absl::Mutex tls_mu(absl::kConstInit);
Tls* tls ABSL_GUARDED_BY(tls_mu) = nullptr;

std::optional<Tls> CurrentTls() {
  absl::MutexLock lock(&tls_mu);
  if (tls == nullptr) return std::nullopt;
  return *tls;
}

}  // namespace

absl::Status UseTls(const TlsFiles& files) {
  if (files.ca.empty() || files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs --tls-ca (the authority that signed the peers' certificates), and "
        "--tls-cert with --tls-key (this process's certificate and key; a server must have "
        "them, a client needs them only for mutual TLS)");
  }
  Tls loaded;
  loaded.mutual = files.mutual;
  std::error_code ignored;
  for (auto [path, pem, variable] : {std::tuple{&files.cert, &loaded.cert, "DRAY_TLS_CERT"},
                                     std::tuple{&files.key, &loaded.key, "DRAY_TLS_KEY"},
                                     std::tuple{&files.ca, &loaded.ca, "DRAY_TLS_CA"}}) {
    if (path->empty()) continue;
    DRAY_ASSIGN_OR_RETURN(*pem, ReadFile(*path));
    setenv(variable, std::filesystem::absolute(*path, ignored).c_str(), 1);
  }
  setenv("DRAY_TLS_MUTUAL", files.mutual ? "1" : "0", 1);
  absl::MutexLock lock(&tls_mu);
  delete tls;
  tls = new Tls(std::move(loaded));
  return absl::OkStatus();
}

void ForgetInheritedTls() {
  for (const char* variable : {"DRAY_TLS_CERT", "DRAY_TLS_KEY", "DRAY_TLS_CA", "DRAY_TLS_MUTUAL"}) {
    unsetenv(variable);
  }
}

absl::Status UseTlsFromEnvironment() {
  auto env = [](const char* name) {
    const char* value = std::getenv(name);
    return std::string(value == nullptr ? "" : value);
  };
  if (env("DRAY_TLS_CA").empty()) return absl::OkStatus();
  return UseTls({env("DRAY_TLS_CERT"), env("DRAY_TLS_KEY"), env("DRAY_TLS_CA"),
                 env("DRAY_TLS_MUTUAL") == "1"});
}

std::shared_ptr<grpc::ServerCredentials> DrayServerCredentials() {
  std::optional<Tls> current = CurrentTls();
  if (!current.has_value()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      current->mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                      : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_root_certs = current->ca;
  options.pem_key_cert_pairs.push_back({current->key, current->cert});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> PublicServerCredentials(
    const std::string& cert_file, const std::string& key_file) {
  if (cert_file.empty() || key_file.empty()) {
    return absl::InvalidArgumentError("a public TLS port needs a certificate and its key");
  }
  DRAY_ASSIGN_OR_RETURN(std::string cert, ReadFile(cert_file));
  DRAY_ASSIGN_OR_RETURN(std::string key, ReadFile(key_file));
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({std::move(key), std::move(cert)});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> DrayChannelCredentials() {
  std::optional<Tls> current = CurrentTls();
  if (!current.has_value()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = current->ca;
  options.pem_private_key = current->key;
  options.pem_cert_chain = current->cert;
  return grpc::SslCredentials(options);
}

}  // namespace dray
