// The session end to end inside one process: a WorkerClient talking to a
// WorkerServiceImpl over real gRPC on loopback, and over a SocketSession as
// to a worker of its node, without worker processes (so failures can be
// staged exactly).
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "dray/v1/worker.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/controller/worker_client.h"
#include "runtime/rpc/grpc_util.h"
#include "runtime/security/job_secret.h"
#include "runtime/transport/socket_session.h"
#include "runtime/worker/worker_host.h"
#include "runtime/worker/worker_service.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kSecret[] = "the job's secret";

// Recorder appends meta "seq" to what it saw, reporting each call as one
// step; "hold" waits for the test's gate.
class Recorder : public Worker {
 public:
  static absl::Notification* gate;

  Recorder() {
    Def("append", &Recorder::Append, {kOneToAll});
    Def("hold", &Recorder::Hold, {kOneToAll});
  }
  absl::StatusOr<DataProto> Append(const DataProto& input) {
    DRAY_ASSIGN_OR_RETURN(int64_t seq, input.GetMeta<int64_t>("seq"));
    seen_.push_back(seq);
    ReportProgress("append", 1, 1);
    return DataProto::Make({}, {{"seen", seen_}});
  }
  absl::StatusOr<DataProto> Hold() {
    gate->WaitForNotification();
    return DataProto();
  }

 private:
  std::vector<int64_t> seen_;
};
absl::Notification* Recorder::gate = nullptr;

// InProcessWorker: a WorkerService on a free loopback port.
class InProcessWorker {
 public:
  InProcessWorker() {
    WorkerClassRegistry classes;
    classes.Add<Recorder>("recorder");
    host_ = WorkerHost::Create(classes, {"recorder"}, 0).value();
    service_ = std::make_unique<WorkerServiceImpl>(host_.get(), 0, kSecret, [](std::string) {});
    grpc::ServerBuilder builder;
    ConfigureDrayServer(&builder);
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    sessions_ = builder.AddCompletionQueue();
    server_ = builder.BuildAndStart();
    acceptor_ = std::thread([this] { service_->AcceptSessions(sessions_.get()); });
    local_sessions_ =
        SessionListener::Listen(kSecret, [service = service_.get()](
                                             std::unique_ptr<SocketSession> session, bool shared) {
          service->ServeSession(std::move(session), shared);
        }).value();
  }
  ~InProcessWorker() { Stop(); }

  // Stop shuts the server down (open sessions break) and waits for it.
  void Stop() {
    if (server_ == nullptr) return;
    local_sessions_.reset();
    service_->StopSessions(server_.get(), sessions_.get(), absl::Now());
    acceptor_.join();
    service_->WaitForSessions();  // a running method must return first
    server_.reset();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  // endpoint: the gRPC port, and the session socket when `local`.
  WorkerEndpoint endpoint(bool local) const {
    return {address(), local ? local_sessions_->address() : ""};
  }

 private:
  int port_ = 0;
  std::unique_ptr<WorkerHost> host_;
  std::unique_ptr<WorkerServiceImpl> service_;
  std::unique_ptr<grpc::ServerCompletionQueue> sessions_;
  std::unique_ptr<grpc::Server> server_;
  std::thread acceptor_;
  std::unique_ptr<SessionListener> local_sessions_;
};

// Every test runs over gRPC (false) and over a SocketSession (true).
class SessionTest : public ::testing::TestWithParam<bool> {};

std::shared_ptr<const EncodedInput> Seq(int64_t seq) {
  return EncodeInput(DataProto::Make({}, {}, {{"seq", seq}}).value()).value();
}

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

TEST_P(SessionTest, CallsRunInSubmissionOrderWithProgressBeforeEachResult) {
  InProcessWorker worker;
  WorkerClient client(0, worker.endpoint(GetParam()), kSecret, nullptr);
  DRAY_ASSERT_OK(client.Open());
  absl::Mutex mu;
  std::vector<std::string> events;
  std::vector<CallFuture> calls;
  for (int64_t seq = 0; seq < 50; ++seq) {
    calls.push_back(client.Submit("", "append", Seq(seq), Soon(),
                                  [&, seq](const std::string& what, int64_t, int64_t) {
                                    absl::MutexLock lock(&mu);
                                    events.push_back(absl::StrCat(what, " ", seq));
                                  }));
    calls.back()->OnReady([&, seq] {
      absl::MutexLock lock(&mu);
      events.push_back(absl::StrCat("result ", seq));
    });
  }
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto last, calls.back()->Wait());
  EXPECT_EQ(last.GetRows<int64_t>("seen").value()->size(), 50u);
  EXPECT_EQ((*last.GetRows<int64_t>("seen").value())[49], 49);
  // Wait() returns once the value is set; OnReady callbacks run just after.
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](std::vector<std::string>* seen) { return seen->size() == 100; }, &events));
  for (int seq = 0; seq < 50; ++seq) {
    EXPECT_EQ(events[2 * seq], absl::StrCat("append ", seq));
    EXPECT_EQ(events[2 * seq + 1], absl::StrCat("result ", seq));
  }
}

TEST_P(SessionTest, APassedDeadlineFailsTheCallAndTheSessionServesOn) {
  InProcessWorker worker;
  absl::Notification gate;
  Recorder::gate = &gate;
  WorkerClient client(0, worker.endpoint(GetParam()), kSecret, nullptr);
  DRAY_ASSERT_OK(client.Open());
  CallFuture held =
      client.Submit("", "hold", Seq(0), absl::Now() + absl::Milliseconds(50), nullptr);
  EXPECT_THAT(held->Wait(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("call 'hold' on worker rank 0 passed its deadline")));
  gate.Notify();
  DRAY_EXPECT_OK(client.Submit("", "append", Seq(1), Soon(), nullptr)->Wait().status());
}

TEST_P(SessionTest, AServerThatGoesAwayFailsPendingAndLaterCalls) {
  auto worker = std::make_unique<InProcessWorker>();
  absl::Notification gate;
  Recorder::gate = &gate;
  absl::Notification lost;
  WorkerClient client(0, worker->endpoint(GetParam()), kSecret,
                      [&](absl::Status) { lost.Notify(); });
  DRAY_ASSERT_OK(client.Open());
  CallFuture pending = client.Submit("", "hold", Seq(0), Soon(), nullptr);
  std::thread stopper([&] { worker->Stop(); });
  lost.WaitForNotification();
  EXPECT_THAT(pending->Wait(), StatusIs(absl::StatusCode::kUnavailable,
                                        HasSubstr("the session with worker rank 0")));
  EXPECT_THAT(client.Submit("", "append", Seq(1), Soon(), nullptr)->Wait(),
              StatusIs(absl::StatusCode::kUnavailable));
  gate.Notify();  // the held method may finish now; the server is gone
  stopper.join();
}

TEST_P(SessionTest, CallsWithoutTheJobSecretAreUnauthenticated) {
  InProcessWorker worker;
  // A socket session is refused when it opens, a gRPC one at its first call.
  WorkerClient stranger(0, worker.endpoint(GetParam()), "a guess", nullptr);
  absl::Status refused = stranger.Open();
  if (refused.ok())
    refused = stranger.Submit("", "append", Seq(0), Soon(), nullptr)->Wait().status();
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("job's secret")));
  auto stub = v1::WorkerService::NewStub(CreateDrayChannel(worker.address()));
  for (const std::string& secret : {std::string(), std::string("a guess")}) {
    grpc::ClientContext describe, shutdown;
    if (!secret.empty()) {
      AttachJobSecret(&describe, secret);
      AttachJobSecret(&shutdown, secret);
    }
    v1::MethodTable table;
    EXPECT_EQ(stub->DescribeMethods(&describe, {}, &table).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::ShutdownResponse stopped;
    EXPECT_EQ(stub->Shutdown(&shutdown, {}, &stopped).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // The rightful client is served.
  WorkerClient client(0, worker.endpoint(GetParam()), kSecret, nullptr);
  DRAY_ASSERT_OK(client.Open());
  DRAY_EXPECT_OK(client.Submit("", "append", Seq(1), Soon(), nullptr)->Wait().status());
}

INSTANTIATE_TEST_SUITE_P(Transports, SessionTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "SocketSession" : "Grpc";
                         });

}  // namespace
}  // namespace dray
