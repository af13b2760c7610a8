#include "runtime/controller/method_dispatcher.h"

#include <atomic>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "dispatch/dispatch_mode.h"

namespace dray {

struct MethodDispatcher::TrafficCounters {
  std::atomic<int64_t> sent{0};
  std::atomic<int64_t> received{0};
};

struct GroupFuture::State {
  std::vector<CallFuture> per_rank;  // of the ranks called, in rank order
  std::vector<bool> collected;       // per_rank's: whether its output is kept
  DispatchPlan plan;
  const DispatchMode* mode = nullptr;
  std::shared_ptr<std::atomic<int64_t>> received_bytes;  // the dispatcher's count
  absl::Mutex mu;
  size_t remaining ABSL_GUARDED_BY(mu) = 0;
  std::optional<absl::Status> first_error ABSL_GUARDED_BY(mu);
  std::optional<absl::StatusOr<std::vector<DataProto>>> result ABSL_GUARDED_BY(mu);
  // Whether every rank answered or one failed: what Get spins on.
  std::atomic<bool> settled{false};

  // Track counts `call` down when it completes; the first error ends the wait.
  static void Track(const std::shared_ptr<State>& state, const CallFuture& call) {
    std::weak_ptr<State> weak = state;  // no cycle: calls do not keep the state alive
    call->OnReady([weak, call] {
      std::shared_ptr<State> self = weak.lock();
      if (self == nullptr) return;
      absl::MutexLock lock(&self->mu);
      --self->remaining;
      if (!call->Wait().ok() && !self->first_error.has_value()) {
        self->first_error = call->Wait().status();
      }
      if (self->remaining == 0 || self->first_error.has_value()) {
        self->settled.store(true, std::memory_order_release);
      }
    });
  }

  // SpinBriefly polls `settled` for up to 100 us before Get sleeps: a
  // small call's answer often comes that soon, and is then seen without a
  // wake-up, which costs tens of microseconds on a virtualized CPU.
  void SpinBriefly() const {
    constexpr absl::Duration kSpin = absl::Microseconds(100);
    const absl::Time until = absl::Now() + kSpin;
    while (!settled.load(std::memory_order_acquire) && absl::Now() < until) {
      for (int i = 0; i < 64; ++i) CpuRelax();
    }
  }

  static void CpuRelax() {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
};

absl::StatusOr<std::vector<DataProto>> GroupFuture::Get() {
  state_->SpinBriefly();
  absl::MutexLock lock(&state_->mu);
  if (state_->result.has_value()) return *state_->result;
  auto settled = [state = state_.get()]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
    return state->remaining == 0 || state->first_error.has_value();
  };
  state_->mu.Await(absl::Condition(&settled));
  if (state_->first_error.has_value()) {
    state_->result = *state_->first_error;
  } else {
    std::vector<DataProto> outputs;
    for (size_t i = 0; i < state_->per_rank.size(); ++i) {
      const DataProto& output = *state_->per_rank[i]->Wait();
      *state_->received_bytes += ContentBytes(output);
      if (state_->collected[i]) outputs.push_back(output);
    }
    state_->result = state_->mode->collect(std::move(outputs), state_->plan);
  }
  state_->plan.per_rank.clear();  // the inputs are no longer needed
  return *state_->result;
}

bool GroupFuture::Ready() const {
  absl::MutexLock lock(&state_->mu);
  return state_->result.has_value() || state_->remaining == 0 || state_->first_error.has_value();
}

void GroupFuture::Cancel(const absl::Status& why) {
  for (const CallFuture& call : state_->per_rank) call->Cancel(why);
}

GroupFuture GroupFuture::Failed(absl::Status status) {
  GroupFuture future;
  future.state_ = std::make_shared<State>();
  absl::MutexLock lock(&future.state_->mu);
  future.state_->result = std::move(status);
  future.state_->settled = true;
  return future;
}

MethodDispatcher::MethodDispatcher(std::vector<v1::MethodInfo> methods,
                                   std::vector<WorkerConnection*> workers)
    : methods_(std::move(methods)),
      workers_(std::move(workers)),
      traffic_(std::make_shared<TrafficCounters>()) {}

GroupTraffic MethodDispatcher::traffic() const {
  return {traffic_->sent.load(), traffic_->received.load()};
}

absl::StatusOr<const v1::MethodInfo*> MethodDispatcher::FindMethod(absl::string_view method) const {
  std::vector<const v1::MethodInfo*> matches;
  std::vector<std::string> known;
  for (const v1::MethodInfo& info : methods_) {
    const std::string qualified = absl::StrCat(info.role(), ".", info.name());
    if (info.name() == method || qualified == method) matches.push_back(&info);
    known.push_back(qualified);
  }
  if (matches.size() == 1) return matches[0];
  if (matches.empty()) {
    return absl::NotFoundError(absl::StrCat("the worker group has no method '", method,
                                            "'; it has: ", absl::StrJoin(known, ", ")));
  }
  std::vector<std::string> roles;
  for (const v1::MethodInfo* info : matches) roles.push_back(info->role());
  return absl::InvalidArgumentError(absl::StrCat("method '", method, "' exists in roles ",
                                                 absl::StrJoin(roles, ", "), ": call it as ",
                                                 roles[0], ".", method));
}

absl::StatusOr<DispatchPlan> MethodDispatcher::Plan(const v1::MethodInfo& info,
                                                    const DispatchMode& mode,
                                                    std::vector<DataProto> inputs,
                                                    const CallOptions& options) const {
  const int group_size = options.rank_group_size;
  if (group_size < 1 || world_size() % group_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank groups of ", group_size, " do not divide a group of ", world_size(), " ranks"));
  }
  const int groups = world_size() / group_size;
  absl::StatusOr<DispatchPlan> plan =
      mode.dispatch(std::move(inputs), {groups, info.rows_independent() && !options.equal_shards});
  if (!plan.ok()) return plan.status();
  if (static_cast<int>(plan->per_rank.size()) != groups) {
    return absl::InternalError(absl::StrCat("dispatch mode ", mode.name, " planned ",
                                            plan->per_rank.size(), " inputs for ", groups,
                                            " rank groups"));
  }
  std::vector<std::shared_ptr<const DataProto>> per_group = std::move(plan->per_rank);
  plan->per_rank.clear();
  for (int rank = 0; rank < world_size(); ++rank)
    plan->per_rank.push_back(per_group[rank / group_size]);
  if (info.execute_mode() == v1::EXECUTE_MODE_RANK_ZERO) {
    for (int rank = 1; rank < world_size(); ++rank) plan->per_rank[rank] = nullptr;
  }
  return plan;
}

GroupFuture MethodDispatcher::Invoke(absl::string_view method, std::vector<DataProto> inputs,
                                     absl::Time deadline, const CallOptions& options) {
  absl::StatusOr<const v1::MethodInfo*> info = FindMethod(method);
  if (!info.ok()) return GroupFuture::Failed(info.status());
  absl::StatusOr<const DispatchMode*> mode =
      DispatchRegistry::Global().Find((*info)->dispatch_mode());
  if (!mode.ok()) return GroupFuture::Failed(mode.status());
  absl::StatusOr<DispatchPlan> plan = Plan(**info, **mode, std::move(inputs), options);
  if (!plan.ok()) return GroupFuture::Failed(plan.status());

  GroupFuture future;
  future.state_ = std::make_shared<GroupFuture::State>();
  GroupFuture::State& state = *future.state_;
  std::map<const DataProto*, std::shared_ptr<const EncodedInput>> encoded;  // once per input
  for (int rank = 0; rank < world_size(); ++rank) {
    const std::shared_ptr<const DataProto>& input = plan->per_rank[rank];
    if (input == nullptr) continue;
    std::shared_ptr<const EncodedInput>& wire = encoded[input.get()];
    if (wire == nullptr) {
      absl::StatusOr<std::shared_ptr<const EncodedInput>> encoding = EncodeInput(*input);
      if (!encoding.ok()) return GroupFuture::Failed(encoding.status());
      wire = *encoding;
    }
    traffic_->sent += ContentBytes(*input);
    CallProgressFn rank_progress;
    if (options.on_progress) {
      rank_progress = [on_progress = options.on_progress, rank](const std::string& what,
                                                                int64_t done, int64_t total) {
        on_progress(rank, what, done, total);
      };
    }
    state.per_rank.push_back(workers_[rank]->Submit((*info)->role(), (*info)->name(), wire,
                                                    deadline, std::move(rank_progress)));
    state.collected.push_back(rank % options.rank_group_size == 0);
  }
  state.plan = std::move(plan).value();
  state.mode = *mode;
  state.received_bytes = std::shared_ptr<std::atomic<int64_t>>(traffic_, &traffic_->received);
  {
    absl::MutexLock lock(&state.mu);
    state.remaining = state.per_rank.size();
    if (state.remaining == 0) state.settled = true;
  }
  for (const CallFuture& call : state.per_rank) GroupFuture::State::Track(future.state_, call);
  if ((*info)->blocking()) future.Get().IgnoreError();
  return future;
}

}  // namespace dray
