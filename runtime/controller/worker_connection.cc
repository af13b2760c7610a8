#include "runtime/controller/worker_connection.h"

#include <utility>

namespace dray {

void CallResult::Set(absl::StatusOr<DataProto> value) {
  std::vector<std::function<void()>> callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (value_.has_value()) return;
    value_ = std::move(value);
    callbacks.swap(callbacks_);
    canceller_ = nullptr;
  }
  for (auto& callback : callbacks) callback();
}

bool CallResult::ready() const {
  absl::MutexLock lock(&mu_);
  return value_.has_value();
}

const absl::StatusOr<DataProto>& CallResult::Wait() const {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](const std::optional<absl::StatusOr<DataProto>>* value) { return value->has_value(); },
      &value_));
  return *value_;
}

void CallResult::OnReady(std::function<void()> callback) {
  {
    absl::MutexLock lock(&mu_);
    if (!value_.has_value()) {
      callbacks_.push_back(std::move(callback));
      return;
    }
  }
  callback();
}

void CallResult::Cancel(const absl::Status& why) {
  std::function<void(const absl::Status&)> canceller;
  {
    absl::MutexLock lock(&mu_);
    canceller = canceller_;
  }
  if (canceller) canceller(why);
}

void CallResult::SetCanceller(std::function<void(const absl::Status& why)> canceller) {
  absl::MutexLock lock(&mu_);
  if (!value_.has_value()) canceller_ = std::move(canceller);
}

absl::StatusOr<std::shared_ptr<const EncodedInput>> EncodeInput(const DataProto& input) {
  absl::StatusOr<DetachedWire> wire = ToDetachedWire(input);
  if (!wire.ok()) return wire.status();
  return std::make_shared<const EncodedInput>(std::move(wire).value());
}

}  // namespace dray
