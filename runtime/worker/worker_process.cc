#include "runtime/worker/worker_process.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "base/stop_signals.h"
#include "dray/v1/controller.grpc.pb.h"
#include "runtime/net/host_address.h"
#include "runtime/process/allocator.h"
#include "runtime/rpc/grpc_util.h"
#include "runtime/security/job_secret.h"
#include "runtime/security/tls.h"
#include "runtime/transport/segment_passage.h"
#include "runtime/transport/socket_session.h"
#include "runtime/worker/worker_host.h"
#include "runtime/worker/worker_service.h"

namespace dray {
namespace {

constexpr absl::Duration kRegisterTimeout = absl::Seconds(30);
// A controller silent for this long is taken for dead.
constexpr absl::Duration kControllerSilenceLimit = absl::Seconds(5);
// How long in-flight RPCs get at shutdown. A method still running then is
// abandoned: the process exits without waiting for it.
constexpr absl::Duration kDrainGrace = absl::Seconds(1);

// Speaker: who a worker's log lines say they come from.
std::string Speaker(int rank) { return absl::StrFormat("worker rank %d (pid %d)", rank, getpid()); }

// StopOnSignals notifies `stop` on SIGTERM or SIGINT. The signals must be
// blocked in every thread first (BlockStopSignals), so only this thread sees them.
void StopOnSignals(absl::Notification* stop) {
  std::thread([stop] {
    WaitForStopSignal();
    if (!stop->HasBeenNotified()) stop->Notify();
  }).detach();
}

absl::StatusOr<v1::RegisterWorkerResponse> Register(
    v1::ControllerService::Stub* controller, const WorkerContext& context,
    const std::string& address, const std::string& local_address,
    const std::string& segment_address, const WorkerHost& host, const std::string& job_secret) {
  v1::RegisterWorkerRequest request;
  request.set_rank(context.rank);
  request.set_address(address);
  request.set_local_address(local_address);
  request.set_segment_address(segment_address);
  request.set_node_id(LocalNodeId());
  request.set_pid(getpid());
  *request.mutable_methods() = host.Describe();
  grpc::ClientContext rpc;
  SetDeadline(&rpc, kRegisterTimeout);
  rpc.set_wait_for_ready(true);
  AttachJobSecret(&rpc, job_secret);
  v1::RegisterWorkerResponse response;
  DRAY_RETURN_IF_ERROR(ToAbslStatus(controller->RegisterWorker(&rpc, request, &response),
                                    "registering with the controller"));
  return response;
}

// Heartbeat pings the controller until `stop` is notified, the controller
// says to stop, or it stays silent past kControllerSilenceLimit.
void Heartbeat(v1::ControllerService::Stub* controller, int rank, const std::string& job_secret,
               absl::Duration interval, absl::Notification* stop) {
  absl::Time last_answer = absl::Now();
  while (!stop->WaitForNotificationWithTimeout(interval)) {
    v1::HeartbeatRequest request;
    request.set_rank(rank);
    v1::HeartbeatResponse response;
    grpc::ClientContext rpc;
    SetDeadline(&rpc, interval);
    AttachJobSecret(&rpc, job_secret);
    if (controller->Heartbeat(&rpc, request, &response).ok()) {
      if (!response.keep_running()) {
        Log(Speaker(rank), "the controller is shutting down; exiting");
        return;
      }
      last_answer = absl::Now();
    } else if (absl::Now() - last_answer > kControllerSilenceLimit) {
      Log(Speaker(rank),
          absl::StrCat("the controller has not answered for ",
                       absl::FormatDuration(absl::Now() - last_answer), "; exiting"));
      return;
    }
  }
}

}  // namespace

absl::StatusOr<WorkerProcessOptions> ParseWorkerProcessFlags(const std::vector<std::string>& args) {
  WorkerProcessOptions options;
  for (const std::string& arg : args) {
    if (absl::StartsWith(arg, "--controller=")) {
      options.controller_address = arg.substr(13);
    } else if (absl::StartsWith(arg, "--roles=")) {
      options.roles = absl::StrSplit(arg.substr(8), ',', absl::SkipEmpty());
    } else if (absl::StartsWith(arg, "--host=")) {
      options.host = arg.substr(7);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown worker argument '", arg,
                       "'; expected --controller=HOST:PORT --roles=A,B [--host=H]"));
    }
  }
  if (options.controller_address.empty()) {
    return absl::InvalidArgumentError("a worker process needs --controller=HOST:PORT");
  }
  if (options.roles.empty()) {
    return absl::InvalidArgumentError(
        "a worker process needs --roles=A[,B...]: the worker classes to host");
  }
  return options;
}

absl::Status RunWorkerProcess(const WorkerClassRegistry& classes,
                              const WorkerProcessOptions& options) {
  BlockStopSignals();
  DRAY_ASSIGN_OR_RETURN(const std::string job_secret, ReadJobSecret(STDIN_FILENO));
  DRAY_ASSIGN_OR_RETURN(WorkerContext context, WorkerContext::FromEnvironment());
  DRAY_ASSIGN_OR_RETURN(std::unique_ptr<WorkerHost> host,
                        WorkerHost::Create(classes, options.roles, context.rank));

  absl::Notification stop;
  // An asked-for shutdown is the normal end: the worker exits quietly. The
  // service and the sessions' queue live until the process exits (WorkerMain
  // ends it with _Exit), since session threads may still use them.
  // Large payloads from a controller of this node come in shared memory.
  // Like the service, the passage lives until the process exits.
  DRAY_ASSIGN_OR_RETURN(std::unique_ptr<SegmentPassage> passage,
                        SegmentPassage::Listen(job_secret));
  SegmentPassage* segments = passage.release();
  auto* service = new WorkerServiceImpl(
      host.get(), context.rank, job_secret,
      [&stop](std::string) {
        if (!stop.HasBeenNotified()) stop.Notify();
      },
      segments);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  ConfigureDrayServer(&builder);
  // The port is bound on the host's address and registered by the host as
  // given: a name stays what the controller dials, and certificates name.
  DRAY_ASSIGN_OR_RETURN(const std::string bind_address, ResolveIPv4(options.host));
  int port = 0;
  builder.AddListeningPort(absl::StrCat(bind_address, ":0"), DrayServerCredentials(), &port);
  builder.RegisterService(service);
  grpc::ServerCompletionQueue* sessions = builder.AddCompletionQueue().release();
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.host));
  }
  std::thread([service, sessions] { service->AcceptSessions(sessions); }).detach();
  // A controller of this node calls through a unix socket instead, without
  // gRPC, TCP or TLS (socket_session.h). It too lives until the process exits.
  DRAY_ASSIGN_OR_RETURN(
      std::unique_ptr<SessionListener> local_sessions,
      SessionListener::Listen(
          job_secret, [service](std::unique_ptr<SocketSession> session, bool shared_memory) {
            service->ServeSession(std::move(session), shared_memory);
          }));
  const std::string local_address = local_sessions.release()->address();
  StopOnSignals(&stop);

  std::shared_ptr<v1::ControllerService::Stub> controller =
      v1::ControllerService::NewStub(CreateDrayChannel(options.controller_address));
  DRAY_ASSIGN_OR_RETURN(v1::RegisterWorkerResponse registered,
                        Register(controller.get(), context, absl::StrCat(options.host, ":", port),
                                 local_address, segments->address(), *host, job_secret));
  Heartbeat(controller.get(), context.rank, job_secret,
            absl::Milliseconds(std::max<int64_t>(registered.heartbeat_interval_ms(), 10)), &stop);

  server->GetHealthCheckService()->SetServingStatus(false);
  // Shutdown waits for running handlers, and a method cannot be interrupted:
  // drain on the side for at most kDrainGrace; the caller then exits.
  auto drained = std::make_shared<absl::Notification>();
  std::thread([server = server.release(), service, sessions, drained] {
    service->StopSessions(server, sessions, absl::Now() + kDrainGrace);
    drained->Notify();
  }).detach();
  drained->WaitForNotificationWithTimeout(kDrainGrace + absl::Milliseconds(200));
  return absl::OkStatus();
}

int WorkerMain(const WorkerClassRegistry& classes, int argc, char** argv) {
  // Debian's Abseil checks every Mutex lock for deadlock cycles, which costs
  // a global graph lookup per lock (a quarter of a small call's time).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  KeepFreedMemoryForReuse();
  absl::StatusOr<WorkerProcessOptions> options =
      ParseWorkerProcessFlags(std::vector<std::string>(argv + 1, argv + argc));
  absl::Status status = options.ok() ? UseTlsFromEnvironment() : options.status();
  if (status.ok()) status = RunWorkerProcess(classes, *options);
  if (!status.ok()) Log("worker", status.ToString());
  // Exit now: a method that is still running (it cannot be interrupted) must
  // not hold the process, nor must destructors of servers waiting for it.
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(status.ok() ? 0 : 1);
}

}  // namespace dray
