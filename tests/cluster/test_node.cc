// A node agent for tests, running the runtime's test workers:
//   test_node --controller=HOST:PORT --token-file=FILE --worker=PATH [--gpus=ID,ID]
// Exits 0 when the controller says stop, 1 otherwise (the reason on stderr).
#include <cstdio>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "runtime/node/node_agent.h"
#include "runtime/security/job_secret.h"

int main(int argc, char** argv) {
  dray::NodeAgentOptions options;
  std::string token_file;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (absl::StartsWith(arg, "--controller=")) options.controller = arg.substr(13);
    if (absl::StartsWith(arg, "--token-file=")) token_file = arg.substr(13);
    if (absl::StartsWith(arg, "--worker=")) options.worker_command = {arg.substr(9)};
    if (absl::StartsWith(arg, "--gpus=")) options.gpus = absl::StrSplit(arg.substr(7), ',');
  }
  absl::StatusOr<std::string> token = dray::ReadSecretFile(token_file);
  absl::Status status = token.ok() ? absl::OkStatus() : token.status();
  if (status.ok()) {
    options.token = *token;
    status = dray::RunNodeAgent(options);
  }
  if (!status.ok()) std::fprintf(stderr, "test_node: %s\n", status.ToString().c_str());
  return status.ok() ? 0 : 1;
}
