#include "workers/train/remote_reward.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdlib>
#include <utility>

#include <grpcpp/client_context.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "dray/v1/reward.grpc.pb.h"
#include "runtime/rpc/grpc_util.h"
#include "runtime/security/job_secret.h"

namespace dray {
namespace {

constexpr absl::Duration kFirstRetryDelay = absl::Milliseconds(100);
constexpr size_t kMaxCallsInFlight = 8;  // per scorer

v1::RgbImage ToRgbImage(const at::Tensor& image) {
  const at::Tensor pixels = image.to(at::kCPU, at::kByte).contiguous();
  v1::RgbImage out;
  out.set_rgb(std::string(static_cast<const char*>(pixels.data_ptr()), pixels.nbytes()));
  out.set_height(static_cast<int32_t>(pixels.size(0)));
  out.set_width(static_cast<int32_t>(pixels.size(1)));
  return out;
}

// Permanent: errors a retry cannot change.
bool Permanent(absl::StatusCode code) {
  return code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kUnauthenticated ||
         code == absl::StatusCode::kPermissionDenied || code == absl::StatusCode::kUnimplemented;
}

}  // namespace

struct RemoteScorers::Scorer {
  RemoteRewardConfig config;
  std::string token;  // empty: none
  std::unique_ptr<v1::RewardService::Stub> stub;

  absl::Status Error(const absl::Status& status) const {
    return absl::Status(status.code(), absl::StrCat("reward scorer '", config.name, "' at ",
                                                    config.address, ": ", status.message()));
  }

  // Call scores one batch, retrying what may pass on a second try.
  absl::StatusOr<v1::ScoreResponse> Call(const v1::ScoreRequest& request) const {
    absl::Status last;
    absl::Duration delay = kFirstRetryDelay;
    for (int64_t attempt = 0; attempt <= config.max_retries; ++attempt) {
      if (attempt > 0) {
        absl::SleepFor(delay);
        delay *= 2;
      }
      grpc::ClientContext context;
      SetDeadline(&context, absl::Milliseconds(config.timeout_ms));
      if (!token.empty()) AttachBearerToken(&context, token);
      v1::ScoreResponse response;
      last = ToAbslStatus(stub->Score(&context, request, &response), "Score");
      if (last.ok()) return response;
      if (Permanent(last.code())) break;
    }
    return Error(absl::Status(
        last.code(),
        absl::StrCat(last.message(), " (after ", config.max_retries + 1, " attempts at most)")));
  }

  // ScoreAll scores every sample in batches of max_batch, all under way at once.
  absl::StatusOr<RemoteScores> ScoreAll(const std::vector<v1::RewardRow>& rows) const {
    if (rows.empty()) {  // a probe: the scorer answers an empty request
      DRAY_RETURN_IF_ERROR(Call(v1::ScoreRequest()).status());
      return RemoteScores();
    }
    std::vector<v1::ScoreRequest> requests;
    for (size_t start = 0; start < rows.size(); start += config.max_batch) {
      v1::ScoreRequest& request = requests.emplace_back();
      for (size_t i = start; i < std::min(rows.size(), start + config.max_batch); ++i)
        *request.add_rows() = rows[i];
    }
    // At most kMaxCallsInFlight calls at once, each started as one ends.
    std::vector<std::future<absl::StatusOr<v1::ScoreResponse>>> calls(requests.size());
    auto start = [&](size_t c) {
      if (c < calls.size())
        calls[c] =
            std::async(std::launch::async, [this, &requests, c] { return Call(requests[c]); });
    };
    for (size_t c = 0; c < kMaxCallsInFlight; ++c) start(c);
    RemoteScores out;
    size_t row = 0;
    for (size_t c = 0; c < calls.size(); ++c) {
      absl::StatusOr<v1::ScoreResponse> answered = calls[c].get();
      start(c + kMaxCallsInFlight);
      DRAY_ASSIGN_OR_RETURN(v1::ScoreResponse response, std::move(answered));
      const size_t expected = std::min<size_t>(config.max_batch, rows.size() - row);
      if (static_cast<size_t>(response.scores_size()) != expected) {
        return Error(absl::InvalidArgumentError(
            absl::StrCat("answered ", response.scores_size(), " scores for ", expected, " rows")));
      }
      for (const v1::RowScore& score : response.scores()) {
        if (!std::isfinite(score.score())) {
          return Error(absl::InvalidArgumentError(
              absl::StrCat("scored sample ", row, " ", score.score(), ", not a finite number")));
        }
        out.scores.push_back(score.score());
        for (const auto& [part, value] : score.components()) {
          std::vector<double>& values = out.components[part];
          values.resize(row, NAN);  // parts a scorer gave only for some rows
          values.push_back(value);
        }
        ++row;
      }
    }
    for (auto& [part, values] : out.components) values.resize(rows.size(), NAN);
    return out;
  }
};

RemoteScorers::RemoteScorers(std::vector<std::unique_ptr<Scorer>> scorers)
    : scorers_(std::move(scorers)) {}

RemoteScorers::~RemoteScorers() = default;

absl::StatusOr<std::unique_ptr<RemoteScorers>> RemoteScorers::Connect(
    const std::vector<RemoteRewardConfig>& configs) {
  std::vector<std::unique_ptr<Scorer>> scorers;
  for (const RemoteRewardConfig& config : configs) {
    auto scorer = std::make_unique<Scorer>();
    scorer->config = config;
    if (!config.token_env.empty()) {
      const char* token = std::getenv(config.token_env.c_str());
      if (token == nullptr || *token == '\0') {
        return absl::InvalidArgumentError(absl::StrCat("worker.reward.remote '", config.name,
                                                       "': token_env ", config.token_env,
                                                       " is not set"));
      }
      scorer->token = token;
    }
    std::shared_ptr<grpc::ChannelCredentials> credentials;  // plaintext when unset
    if (!config.tls_ca.empty()) {
      grpc::SslCredentialsOptions tls;
      absl::StatusOr<std::string> roots = ReadFile(config.tls_ca);
      if (!roots.ok()) {
        return absl::NotFoundError(absl::StrCat("worker.reward.remote '", config.name,
                                                "': cannot read tls_ca ", config.tls_ca));
      }
      tls.pem_root_certs = *std::move(roots);
      credentials = grpc::SslCredentials(tls);
    }
    scorer->stub = v1::RewardService::NewStub(CreateExternalChannel(config.address, credentials));
    scorers.push_back(std::move(scorer));
  }
  return std::unique_ptr<RemoteScorers>(new RemoteScorers(std::move(scorers)));
}

std::future<absl::StatusOr<std::vector<RemoteScores>>> RemoteScorers::Score(
    std::vector<RewardInput> samples) const {
  return std::async(
      std::launch::async,
      [this, samples = std::move(samples)]() -> absl::StatusOr<std::vector<RemoteScores>> {
        std::vector<v1::RewardRow> rows;
        for (const RewardInput& sample : samples) {
          v1::RewardRow& row = rows.emplace_back();
          *row.mutable_input_image() = ToRgbImage(sample.input);
          *row.mutable_output_image() = ToRgbImage(sample.output);
          row.set_instruction(sample.instruction);
          row.set_fields_json(sample.fields.dump());
          if (sample.target.defined()) *row.mutable_target_image() = ToRgbImage(sample.target);
        }
        std::vector<std::future<absl::StatusOr<RemoteScores>>> pending;
        for (const auto& scorer : scorers_) {
          pending.push_back(
              std::async(std::launch::async, [&scorer, &rows] { return scorer->ScoreAll(rows); }));
        }
        std::vector<RemoteScores> scores;
        absl::Status first_error;
        for (auto& future : pending) {
          absl::StatusOr<RemoteScores> one = future.get();
          if (!one.ok() && first_error.ok()) first_error = one.status();
          if (one.ok()) scores.push_back(*std::move(one));
        }
        if (!first_error.ok()) return first_error;
        return scores;
      });
}

}  // namespace dray
