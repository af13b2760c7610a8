// FakeWorkerConnection: a worker without a process, for unit tests of the
// controller's dispatch and collect logic. Each Submit decodes the call's
// input and records the call; `answer`, when set, answers it at once, else
// the call stays pending until the test resolves it.
//
//   FakeWorkerConnection worker([](const std::string& method, const DataProto& input) {
//     return input;  // echo
//   });
//   MethodDispatcher dispatcher(methods, {&worker});
//
// Thread-safety: thread-safe.
#ifndef DRAY_RUNTIME_CONTROLLER_FAKE_WORKER_CONNECTION_H_
#define DRAY_RUNTIME_CONTROLLER_FAKE_WORKER_CONNECTION_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "runtime/controller/worker_connection.h"

namespace dray {

class FakeWorkerConnection final : public WorkerConnection {
 public:
  using Answer =
      std::function<absl::StatusOr<DataProto>(const std::string& method, const DataProto& input)>;

  // One submitted call, as the worker would have received it.
  struct Call {
    std::string role;
    std::string method;
    std::shared_ptr<const EncodedInput> wire;  // what would have been sent
    absl::StatusOr<DataProto> input;           // `wire` decoded
    absl::Time deadline;
    CallProgressFn on_progress;  // a test reports the call's progress through it
    CallFuture result;
  };

  explicit FakeWorkerConnection(Answer answer = nullptr) : answer_(std::move(answer)) {}

  CallFuture Submit(std::string role, std::string method, std::shared_ptr<const EncodedInput> input,
                    absl::Time deadline, CallProgressFn on_progress) override {
    v1::DataProto message = input->header;
    message.set_payload(input->payload.Flatten());
    Call call{std::move(role),
              std::move(method),
              input,
              FromWire(std::move(message)),
              deadline,
              std::move(on_progress),
              std::make_shared<CallResult>()};
    CallFuture result = call.result;
    {
      absl::MutexLock lock(&mu_);
      calls_.push_back(call);
    }
    if (answer_) {
      result->Set(call.input.ok() ? answer_(call.method, *call.input) : call.input.status());
    }
    return result;
  }

  // calls returns every call submitted so far, in order.
  std::vector<Call> calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  const Answer answer_;
  mutable absl::Mutex mu_;
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dray

#endif  // DRAY_RUNTIME_CONTROLLER_FAKE_WORKER_CONNECTION_H_
