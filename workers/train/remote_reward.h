// Rewards from scorers that run elsewhere: dray.v1.RewardService
// (proto/dray/v1/reward.proto) servers named by worker.reward.remote, in
// any language (examples/python/reward_server.py).
//
//   DRAY_ASSIGN_OR_RETURN(auto scorers, RemoteScorers::Connect(config.remote_rewards));
//   auto pending = scorers->Score(samples);     // every call under way
//   ... compute the built-in rewards meanwhile ...
//   DRAY_ASSIGN_OR_RETURN(std::vector<RemoteScores> scores, pending.get());
//
// Each scorer gets the samples in calls of at most max_batch rows, up to 8
// at once, each with a deadline of timeout_ms; a failed call is retried up to
// max_retries times (after 0.1 s, then doubling), unless its error cannot
// change (INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED,
// UNIMPLEMENTED). A scorer that stays down, or answers the wrong number of
// scores or one that is not finite, fails the step with an error naming it
// and its address. With tls_ca the channel is TLS; with token_env every
// call carries "authorization: Bearer <the variable's value>".
//
// Thread-safety: Score may be called from any thread.
#ifndef DRAY_WORKERS_TRAIN_REMOTE_REWARD_H_
#define DRAY_WORKERS_TRAIN_REMOTE_REWARD_H_

#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "workers/train/rewards.h"
#include "workers/train/train_config.h"

namespace dray {

// RemoteScores: one scorer's answer for every sample.
struct RemoteScores {
  std::vector<double> scores;
  std::map<std::string, std::vector<double>> components;  // by part, one per sample
};

class RemoteScorers {
 public:
  // Connect opens a channel to each scorer (lazily: nothing is dialed yet);
  // a token_env naming no variable is INVALID_ARGUMENT, an unreadable
  // tls_ca NOT_FOUND.
  static absl::StatusOr<std::unique_ptr<RemoteScorers>> Connect(
      const std::vector<RemoteRewardConfig>& configs);
  ~RemoteScorers();

  // Score starts scoring `samples` on every scorer and returns at once; the
  // future holds each scorer's scores, in worker.reward.remote's order. No
  // samples: one empty call to each, to learn that it answers.
  std::future<absl::StatusOr<std::vector<RemoteScores>>> Score(
      std::vector<RewardInput> samples) const;

 private:
  struct Scorer;
  explicit RemoteScorers(std::vector<std::unique_ptr<Scorer>> scorers);
  std::vector<std::unique_ptr<Scorer>> scorers_;
};

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_REMOTE_REWARD_H_
