#include "runtime/security/job_secret.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status_macros.h"

namespace dray {

std::string NewJobSecret() {
  std::string bytes(32, '\0');
  size_t filled = 0;
  while (filled < bytes.size()) {
    const ssize_t got = getrandom(bytes.data() + filled, bytes.size() - filled, 0);
    if (got > 0) filled += static_cast<size_t>(got);
  }
  return absl::BytesToHexString(bytes);
}

absl::StatusOr<std::string> ReadJobSecret(int fd) {
  std::string secret;
  char buffer[256];
  while (secret.size() < 4096) {
    const ssize_t got = read(fd, buffer, sizeof(buffer));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      return absl::UnavailableError(absl::StrCat("reading the job secret: ", strerror(errno)));
    if (got == 0) break;
    secret.append(buffer, static_cast<size_t>(got));
  }
  absl::StripAsciiWhitespace(&secret);
  if (secret.empty()) {
    return absl::InvalidArgumentError(
        "no job secret on standard input: a worker is started by its controller");
  }
  return secret;
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  DRAY_ASSIGN_OR_RETURN(std::string token, ReadFile(path));
  absl::StripAsciiWhitespace(&token);
  if (token.empty())
    return absl::InvalidArgumentError(absl::StrCat("the token file ", path, " is empty"));
  return token;
}

void AttachJobSecret(grpc::ClientContext* context, absl::string_view secret) {
  context->AddMetadata(kJobSecretMetadata, std::string(secret));
}

namespace {

// Carries is true when metadata `key` equals `value`, in the same time
// wherever they differ.
bool Carries(const grpc::ServerContextBase& context, const char* key, absl::string_view value) {
  const auto& metadata = context.client_metadata();
  auto found = metadata.find(key);
  return found != metadata.end() &&
         ShowsSecret(absl::string_view(found->second.data(), found->second.size()), value);
}

}  // namespace

bool ShowsSecret(absl::string_view shown, absl::string_view secret) {
  if (shown.size() != secret.size()) return false;
  uint8_t difference = 0;
  for (size_t i = 0; i < secret.size(); ++i) difference |= shown[i] ^ secret[i];
  return difference == 0;
}

absl::Status CheckJobSecret(const grpc::ServerContextBase& context, absl::string_view secret) {
  if (Carries(context, kJobSecretMetadata, secret)) return absl::OkStatus();
  return absl::UnauthenticatedError("this call does not carry the job's secret");
}

void AttachBearerToken(grpc::ClientContext* context, absl::string_view token) {
  context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
}

absl::Status CheckBearerToken(const grpc::ServerContextBase& context, absl::string_view token) {
  if (Carries(context, "authorization", absl::StrCat("Bearer ", token))) return absl::OkStatus();
  return absl::UnauthenticatedError(
      "this service needs a client token: send metadata 'authorization: Bearer TOKEN'");
}

}  // namespace dray
