// WorkerServiceImpl: the gRPC glue of dray.v1.WorkerService in a worker
// process. It decodes calls, hands them to a WorkerHost and encodes results;
// the Session stream runs calls in arrival order and streams payloads of any
// size, on raw byte buffers (session_stream.h), over gRPC or, from a
// controller of this node, a SocketSession (ServeSession); Cancel asks a
// session's call to stop early. Kept apart from WorkerHost so
// heavy gRPC headers stay out of worker code.
//
// Session is served on gRPC's asynchronous API as a raw method (generated
// WithRawMethod_Session), the others synchronously:
//
//   WorkerServiceImpl service(host, rank, on_shutdown);
//   builder.RegisterService(&service);
//   std::unique_ptr<grpc::ServerCompletionQueue> sessions = builder.AddCompletionQueue();
//   auto server = builder.BuildAndStart();
//   std::thread([&] { service.AcceptSessions(sessions.get()); });
//   ...
//   service.StopSessions(server.get(), sessions.get(), deadline);  // AcceptSessions returns
//
// Each session runs on a thread of its own, which alone drives that call's
// completion queue, so reading and writing frames costs no thread hand-off.
//
// Thread-safety: thread-safe (gRPC calls it from its own threads). It must
// outlive the server and every session thread; a worker process never
// destroys it (it exits with _Exit).
#ifndef DRAY_RUNTIME_WORKER_WORKER_SERVICE_H_
#define DRAY_RUNTIME_WORKER_WORKER_SERVICE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include <grpcpp/server.h>

#include "absl/synchronization/mutex.h"
#include "dispatch/wire.h"
#include "dray/v1/worker.grpc.pb.h"
#include "runtime/rpc/session_stream.h"
#include "runtime/transport/socket_session.h"
#include "runtime/worker/worker_host.h"

namespace dray {

class WorkerServiceImpl final
    : public v1::WorkerService::WithRawMethod_Session<v1::WorkerService::Service> {
 public:
  // `on_shutdown` runs when a Shutdown RPC arrives; `host` and `segments`
  // (through which a controller of this node passes large payloads; may be
  // null) must outlive this. Every call must carry `job_secret`
  // (UNAUTHENTICATED otherwise).
  WorkerServiceImpl(WorkerHost* host, int rank, std::string job_secret,
                    std::function<void(std::string reason)> on_shutdown,
                    SegmentPassage* segments = nullptr);

  grpc::Status Call(grpc::ServerContext* context, const v1::CallRequest* request,
                    v1::CallResponse* response) override;
  grpc::Status DescribeMethods(grpc::ServerContext* context,
                               const v1::DescribeMethodsRequest* request,
                               v1::MethodTable* response) override;
  grpc::Status Shutdown(grpc::ServerContext* context, const v1::ShutdownRequest* request,
                        v1::ShutdownResponse* response) override;
  grpc::Status Cancel(grpc::ServerContext* context, const v1::CancelRequest* request,
                      v1::CancelResponse* response) override;

  // AcceptSessions runs every Session stream that arrives through `queue`
  // (the server's completion queue) on a thread of its own; it returns once
  // the server and then the queue were shut down.
  void AcceptSessions(grpc::ServerCompletionQueue* queue);

  // ServeSession runs the calls of a SocketSession from this node (a
  // SessionListener's handler) on the caller's thread, and ends it.
  void ServeSession(std::unique_ptr<SocketSession> session, bool shared_memory);

  // StopSessions shuts `server` down (calls still running at `deadline` are
  // cancelled), then `queue`, so that AcceptSessions returns, and breaks
  // every SocketSession; no session starts once it has begun.
  void StopSessions(grpc::Server* server, grpc::ServerCompletionQueue* queue, absl::Time deadline);

  // WaitForSessions returns once every session thread has ended (after the
  // server's shutdown, each ends when its running method returns).
  void WaitForSessions();

 private:
  // RunSession runs the calls of one Session stream in arrival order;
  // `shared_memory`: its client holds segments_, which then carries large
  // results.
  absl::Status RunSession(SessionReader* reader, SessionWriter* writer, bool shared_memory);

  // Run executes `request` on its input's payload `input` and returns the
  // response with the result's payload detached into `*payload`; the
  // method's progress goes to `progress`. `cancellable`: a session's call,
  // which Cancel may stop; every call stops at its deadline.
  v1::CallResponse Run(const v1::CallRequest& request, const ScatteredPayload& input,
                       ScatteredPayload* payload, bool cancellable,
                       const ProgressSink& progress = nullptr);
  // StopRequested is a call's CallHooks::stop: why it must end now, if it must.
  absl::Status StopRequested(uint64_t call_id, bool cancellable, int64_t deadline_unix_ms);
  // Finished forgets the cancellations of session calls up to `call_id`.
  void Finished(uint64_t call_id);

  WorkerHost* const host_;
  const int rank_;
  const std::string job_secret_;
  const std::function<void(std::string)> on_shutdown_;
  SegmentPassage* const segments_;
  absl::Mutex mu_;
  int running_sessions_ ABSL_GUARDED_BY(mu_) = 0;
  // Session calls asked to stop that have not finished, and the latest
  // finished one (session call ids increase).
  std::map<uint64_t, absl::Status> cancelled_ ABSL_GUARDED_BY(mu_);
  uint64_t finished_ ABSL_GUARDED_BY(mu_) = 0;
  // Held while a session is requested (gRPC refuses requests after
  // shutdown), and while a SocketSession starts or ends.
  absl::Mutex accept_mu_;
  bool stopping_ ABSL_GUARDED_BY(accept_mu_) = false;
  std::set<SocketSession*> socket_sessions_ ABSL_GUARDED_BY(accept_mu_);
};

}  // namespace dray

#endif  // DRAY_RUNTIME_WORKER_WORKER_SERVICE_H_
