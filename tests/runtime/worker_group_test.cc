// End-to-end tests of the actor runtime: a real controller (this process)
// driving real worker processes over real gRPC, with real c10d collectives.
#include "runtime/controller/worker_group.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <ATen/ops/arange.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "dispatch/wire.h"
#include "dray/v1/controller.grpc.pb.h"
#include "dray/v1/worker.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "runtime/rpc/grpc_util.h"
#include "runtime/security/job_secret.h"
#include "tests/runtime/test_util.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::ContainsRegex;
using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

// Batch returns rows 0..n-1 in a tensor column "x" and a string column "s".
DataProto Batch(int64_t n) {
  std::vector<std::string> strings;
  for (int64_t i = 0; i < n; ++i) strings.push_back(absl::StrCat("row", i));
  return DataProto::Make({{"x", at::arange(n, at::kLong)}}, {{"s", strings}}).value();
}

std::vector<int64_t> Column(const DataProto& data, const std::string& name) {
  if (data.GetTensor(name).ok()) {
    const at::Tensor x = data.GetTensor(name).value().contiguous();
    return std::vector<int64_t>(x.data_ptr<int64_t>(), x.data_ptr<int64_t>() + x.numel());
  }
  return *data.GetRows<int64_t>(name).value();
}

int64_t Meta(const DataProto& data, const std::string& key) {
  return data.GetMeta<int64_t>(key).value();
}

class WorkerGroupTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { group_ = StartGroup({1, 4}, {"test", "other"}).value().release(); }
  static void TearDownTestSuite() {
    delete group_;
    group_ = nullptr;
  }
  static WorkerGroup* group_;
};

WorkerGroup* WorkerGroupTest::group_ = nullptr;

TEST_F(WorkerGroupTest, EachAnswerSaysWhatItsRankHoldsInMemory) {
  for (const RankMemory& rank : group_->memory()) EXPECT_FALSE(rank.known);
  DRAY_ASSERT_OK(group_->Call("identity", {}).status());
  for (const RankMemory& rank : group_->memory()) {
    EXPECT_TRUE(rank.known);
    EXPECT_GT(rank.resident_bytes, 1 << 20);  // a process with LibTorch holds more than 1 MiB
    EXPECT_EQ(rank.device_allocated_bytes, 0);
  }
}

TEST_F(WorkerGroupTest, OneToAllReachesEveryRankWithItsIdentity) {
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> out, group_->Call("identity", {}));
  ASSERT_EQ(out.size(), 4u);
  std::set<std::string> store_files;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(Meta(out[rank], "rank"), rank);
    EXPECT_EQ(Meta(out[rank], "world_size"), 4);
    EXPECT_EQ(Meta(out[rank], "local_rank"), rank);
    EXPECT_EQ(Meta(out[rank], "local_world_size"), 4);
    EXPECT_EQ(out[rank].GetMeta<std::string>("cuda_visible_devices").value(), absl::StrCat(rank));
    EXPECT_EQ(out[rank].GetMeta<std::string>("master_addr").value(), "127.0.0.1");
    EXPECT_EQ(Meta(out[rank], "pid"), group_->pids()[rank]);
    store_files.insert(out[rank].GetMeta<std::string>("store_file").value());
  }
  // The ranks meet through one file that only this user can reach: no
  // store listens on a port.
  ASSERT_EQ(store_files.size(), 1u);
  struct stat dir;
  ASSERT_EQ(stat(std::filesystem::path(*store_files.begin()).parent_path().c_str(), &dir), 0);
  EXPECT_EQ(dir.st_mode & 0777, 0700);
}

// Every test of this file runs twice: as is, where calls reach the workers
// through their unix sockets, and with DRAY_TRANSPORT=tcp.
bool OverTcp() {
  const char* forced = std::getenv("DRAY_TRANSPORT");
  return forced != nullptr && std::string(forced) == "tcp";
}

TEST_F(WorkerGroupTest, CallsTakeTheUnixSocketsOnThisNodeUnlessTcpIsAsked) {
  const bool tcp = OverTcp();
  const std::vector<std::string> listening = group_->worker_addresses();
  const std::vector<std::string> called = group_->call_addresses();
  ASSERT_EQ(called.size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(listening[rank], StartsWith("127.0.0.1:"));
    if (tcp) {
      EXPECT_EQ(called[rank], listening[rank]);
    } else {
      EXPECT_THAT(called[rank], StartsWith("unix-abstract:dray-worker-"));
    }
  }
  WorkerGroupOptions options;
  options.transport = WorkerGroupOptions::Transport::kTcp;
  DRAY_ASSERT_OK_AND_ASSIGN(auto over_tcp, StartGroup({1, 2}, {"test"}, options));
  EXPECT_EQ(over_tcp->call_addresses(), over_tcp->worker_addresses());
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> out, over_tcp->Call("identity", {}));
  EXPECT_EQ(out.size(), 2u);
}

TEST_F(WorkerGroupTest, DpComputeProtoPadsAndRestoresOrder) {
  const DataProto batch = Batch(10);
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> out, group_->Call("test.echo", {batch}));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_THAT(Column(out[0], "x"), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
  EXPECT_EQ(*out[0].GetRows<std::string>("s").value(), *batch.GetRows<std::string>("s").value());
  // 10 rows padded to 12 over 4 ranks: 3 rows each, padding dropped from rank 3.
  EXPECT_THAT(Column(out[0], "rank"), ElementsAre(0, 0, 0, 1, 1, 1, 2, 2, 2, 3));
  EXPECT_EQ(batch.size(), 10);  // the caller's batch is never padded in place
}

TEST_F(WorkerGroupTest, DpComputeProtoWithFewerRowsThanRanksAndNoRows) {
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> small, group_->Call("test.echo", {Batch(3)}));
  EXPECT_THAT(Column(small[0], "x"), ElementsAre(0, 1, 2));
  EXPECT_THAT(Column(small[0], "rank"), ElementsAre(0, 1, 2));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> empty, group_->Call("test.echo", {Batch(0)}));
  EXPECT_EQ(empty[0].size(), 0);
  EXPECT_TRUE(empty[0].HasColumn("x"));
}

TEST_F(WorkerGroupTest, DpComputeMetricKeepsPerRankOutputs) {
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> out, group_->Call("metric", {Batch(6)}));
  ASSERT_EQ(out.size(), 4u);
  EXPECT_THAT(Column(out[3], "x"), ElementsAre(0, 1));  // padding rows stay
  EXPECT_THAT(Column(out[3], "rank"), ElementsAre(3, 3));
}

TEST_F(WorkerGroupTest, PerRankModesGiveEachRankItsOwnInput) {
  std::vector<DataProto> inputs;
  for (int rank = 0; rank < 4; ++rank) inputs.push_back(Batch(rank + 1));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> dp, group_->Call("per_rank", inputs));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> all, group_->Call("all_to_all", inputs));
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(dp[rank].size(), rank + 1);
    EXPECT_EQ(all[rank].size(), rank + 1);
    EXPECT_EQ(Column(all[rank], "rank")[0], rank);
  }
  EXPECT_THAT(group_->Call("per_rank", {Batch(1)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one input per rank (4)")));
}

TEST_F(WorkerGroupTest, RankZeroDispatchAndExecuteModes) {
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> dispatched, group_->Call("rank_zero", {}));
  ASSERT_EQ(dispatched.size(), 1u);
  EXPECT_EQ(Meta(dispatched[0], "rank"), 0);
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> executed,
                            group_->Call("identity_on_rank_zero", {}));
  ASSERT_EQ(executed.size(), 1u);
  EXPECT_EQ(Meta(executed[0], "rank"), 0);
}

TEST_F(WorkerGroupTest, WorkerErrorsNameMethodRankAndMessage) {
  EXPECT_THAT(group_->Call("fail_on_rank_one", {}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("rank 1, test.fail_on_rank_one: rank one refuses")));
  EXPECT_THAT(group_->Call("throw", {}),
              StatusIs(absl::StatusCode::kInternal,
                       ContainsRegex("rank [0-3], test.throw threw: something broke")));
  EXPECT_THAT(group_->Call("drop_rows", {Batch(5)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one row per input row")));
  EXPECT_THAT(group_->Call("no_such_method", {}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("it has: ")));
  // The workers keep serving after errors.
  DRAY_EXPECT_OK(group_->Call("identity", {}));
}

TEST_F(WorkerGroupTest, ColocatedRolesShareProcesses) {
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> roles, group_->Call("role", {}));
  EXPECT_EQ(roles[2].GetMeta<std::string>("role").value(), "other");
  EXPECT_THAT(group_->Call("echo", {Batch(1)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("call it as test.echo")));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> qualified,
                            group_->Call("other.echo", {Batch(2)}));
  EXPECT_EQ(qualified.size(), 4u);  // other.echo is ONE_TO_ALL
  DRAY_EXPECT_OK(group_->Call("test.echo", {Batch(2)}));
}

TEST_F(WorkerGroupTest, AsynchronousCallsRunAndReturnInOrder) {
  std::vector<GroupFuture> futures;
  for (int64_t seq = 0; seq < 50; ++seq) {
    futures.push_back(group_->Invoke("append", {DataProto::Make({}, {}, {{"seq", seq}}).value()}));
  }
  std::vector<int64_t> previous;
  for (int64_t seq = 0; seq < 50; ++seq) {
    DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> out, futures[seq].Get());
    for (const DataProto& rank_output : out) {
      const std::vector<int64_t> seen = *rank_output.GetRows<int64_t>("seen").value();
      ASSERT_FALSE(seen.empty());
      EXPECT_EQ(seen.back(), seq);  // each worker ran the calls in submission order
      if (seen.size() >= 2) {
        EXPECT_EQ(seen[seen.size() - 2], seq - 1);
      }
    }
  }
}

TEST_F(WorkerGroupTest, SubmittingNeverWaitsOnABusyWorker) {
  // While every worker is busy (it is not reading its session), 64 MiB of
  // calls are submitted: far more than the transport buffers. Had submitting
  // waited for the workers, the file they wait for would never be created.
  const std::string path = absl::StrCat(::testing::TempDir(), "release_workers");
  std::remove(path.c_str());
  GroupFuture busy =
      group_->Invoke("wait_for_file", {DataProto::Make({}, {}, {{"path", path}}).value()});
  const at::Tensor rows = at::arange(8 << 20, at::kFloat).reshape({64, 1 << 17});  // 32 MiB
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto large, DataProto::Make({{"rows", rows}}));
  std::vector<GroupFuture> queued;
  for (int i = 0; i < 2; ++i) queued.push_back(group_->Invoke("echo_async", {large}));
  std::ofstream(path).put('!');
  DRAY_ASSERT_OK(busy.Get().status());
  for (GroupFuture& future : queued) {
    DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> out, future.Get());
    EXPECT_TRUE(SameTensor(out[0].GetTensor("rows").value(), rows));
  }
}

TEST_F(WorkerGroupTest, NonBlockingMethodsReturnFutures) {
  GroupFuture future = group_->Invoke("echo_async", {Batch(8)});
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> out, future.Get());
  EXPECT_THAT(Column(out[0], "x"), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_TRUE(future.Ready());
  DRAY_ASSERT_OK(future.Get().status());  // Get may be called again
}

TEST_F(WorkerGroupTest, DeadlineFailsTheCallAndLeavesTheWorkerUsable) {
  // The workers wait for a file only this test creates, after the deadline
  // has failed the call: the failure cannot have waited for them.
  const std::string path = absl::StrCat(::testing::TempDir(), "deadline_passed");
  std::remove(path.c_str());
  const DataProto wait = DataProto::Make({}, {}, {{"path", path}}).value();
  EXPECT_THAT(group_->Call("wait_for_file", {wait}, CallOptions{absl::Milliseconds(200)}),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("passed its deadline")));
  std::ofstream(path).put('!');
  // The worker finishes the abandoned call, then serves the next one.
  DRAY_EXPECT_OK(group_->Call("identity", {}, CallOptions{absl::Seconds(30)}));
}

TEST_F(WorkerGroupTest, GlooAllReduceAcrossWorkerProcesses) {
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> out, group_->Call("all_reduce", {}));
  for (const DataProto& rank_output : out) {
    const at::Tensor sum = rank_output.GetTensor("sum").value();
    EXPECT_EQ(sum[0][0].item<double>(), 1.0 + 2.0 + 3.0 + 4.0);
  }
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> again, group_->Call("all_reduce", {}));
  EXPECT_EQ(again[3].GetTensor("sum").value()[0][2].item<double>(), 10.0);
}

// MappedSegments counts the shared-memory payloads this process received
// and still maps.
int MappedSegments() {
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);) {
    // Read-only: a received segment (the pool maps its own segments to write).
    count += line.find(" r--s ") != std::string::npos &&
             line.find("memfd:dray-payload") != std::string::npos;
  }
  return count;
}

TEST_F(WorkerGroupTest, LargeBatchesCrossTheSession) {
  // 64 MiB of float32 crosses each way: on this node in shared memory,
  // which the result maps while it lives; over TCP in 2 MiB chunks.
  const bool tcp = OverTcp();
  const at::Tensor big = at::arange(16 << 20, at::kFloat).reshape({16, 1 << 20});
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto batch, DataProto::Make({{"big", big}}));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> out, group_->Call("test.echo", {batch}));
  EXPECT_TRUE(SameTensor(out[0].GetTensor("big").value(), big));
  {
    // DP_COMPUTE_METRIC keeps each rank's output, as it came.
    DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> per_rank, group_->Call("metric", {batch}));
    ASSERT_EQ(per_rank.size(), 4u);
    EXPECT_TRUE(SameTensor(per_rank[3].GetTensor("big").value(), big.slice(0, 12, 16)));
    EXPECT_EQ(MappedSegments(), tcp ? 0 : 4);
  }
  EXPECT_EQ(MappedSegments(), 0) << "a segment is unmapped with the last tensor on it";
}

// HealthOf asks the standard grpc.health.v1 service at `address`.
absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> HealthOf(
    const std::string& address) {
  auto stub = grpc::health::v1::Health::NewStub(CreateDrayChannel(address));
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(5));
  grpc::health::v1::HealthCheckResponse response;
  absl::Status status = ToAbslStatus(stub->Check(&context, {}, &response), address);
  if (!status.ok()) return status;
  return response.status();
}

TEST_F(WorkerGroupTest, ControllerAndWorkersServeGrpcHealth) {
  EXPECT_EQ(HealthOf(group_->controller_address()).value(),
            grpc::health::v1::HealthCheckResponse::SERVING);
  for (const std::string& address : group_->worker_addresses()) {
    EXPECT_EQ(HealthOf(address).value(), grpc::health::v1::HealthCheckResponse::SERVING) << address;
  }
}

// CallOnce runs `role`.`method` on the worker at `address` through the unary
// Call RPC, the way a simple client (one without sessions) would, carrying
// `secret`.
absl::StatusOr<v1::CallResponse> CallOnce(const std::string& address, const std::string& secret,
                                          const std::string& role, const std::string& method,
                                          const DataProto& input) {
  auto stub = v1::WorkerService::NewStub(CreateDrayChannel(address));
  v1::CallRequest request;
  request.set_role(role);
  request.set_method(method);
  DRAY_ASSIGN_OR_RETURN(*request.mutable_input(), ToWire(input));
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(10));
  AttachJobSecret(&context, secret);
  v1::CallResponse response;
  DRAY_RETURN_IF_ERROR(ToAbslStatus(stub->Call(&context, request, &response), address));
  return response;
}

TEST_F(WorkerGroupTest, UnaryCallServesSimpleClients) {
  const std::string address = group_->worker_addresses()[1];
  const std::string& secret = group_->job_secret();
  DRAY_ASSERT_OK_AND_ASSIGN(v1::CallResponse echoed,
                            CallOnce(address, secret, "test", "echo", Batch(3)));
  ASSERT_FALSE(echoed.has_error()) << echoed.error().message();
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto result, FromWire(echoed.result()));
  EXPECT_THAT(Column(result, "x"), ElementsAre(0, 1, 2));

  DRAY_ASSERT_OK_AND_ASSIGN(v1::CallResponse failed,
                            CallOnce(address, secret, "test", "no_such_method", Batch(1)));
  ASSERT_TRUE(failed.has_error());
  EXPECT_EQ(failed.error().code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_THAT(failed.error().message(), AllOf(HasSubstr("rank 1"), HasSubstr("no_such_method")));
}

// EchoOverTypedSession runs test.echo on each input over one Session opened
// with the generated, typed stub, as any gRPC client sees the protocol:
// inputs above 64 KiB are detached and sent in odd-sized chunks, the others
// inline. Returns the decoded results in order.
absl::StatusOr<std::vector<DataProto>> EchoOverTypedSession(const std::string& address,
                                                            const std::string& secret,
                                                            const std::vector<DataProto>& inputs) {
  auto stub = v1::WorkerService::NewStub(CreateDrayChannel(address));
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(30));
  AttachJobSecret(&context, secret);
  auto stream = stub->Session(&context);
  for (size_t i = 0; i < inputs.size(); ++i) {
    v1::CallRequestFrame frame;
    v1::CallRequest* request = frame.mutable_header();
    request->set_role("test");
    request->set_method("echo");
    request->set_call_id(i + 1);
    DRAY_ASSIGN_OR_RETURN(*request->mutable_input(), ToWire(inputs[i]));
    const std::string payload = request->input().payload();
    const bool detached = payload.size() > (64 << 10);
    if (detached) request->mutable_input()->clear_payload();
    stream->Write(frame);
    for (size_t offset = 0; detached && offset < payload.size(); offset += 100003) {
      v1::CallRequestFrame chunk;
      chunk.set_payload_chunk(payload.substr(offset, 100003));
      stream->Write(chunk);
    }
  }
  stream->WritesDone();
  std::vector<DataProto> results;
  v1::CallResponseFrame frame;
  while (stream->Read(&frame)) {
    if (!frame.has_header() || !frame.header().has_result()) {
      return absl::InternalError(absl::StrCat("unexpected frame: ", frame.ShortDebugString()));
    }
    v1::DataProto result = frame.header().result();
    while (result.payload().size() < result.payload_size() && stream->Read(&frame)) {
      result.mutable_payload()->append(frame.payload_chunk());
    }
    DRAY_ASSIGN_OR_RETURN(DataProto decoded, FromWire(std::move(result)));
    results.push_back(std::move(decoded));
  }
  DRAY_RETURN_IF_ERROR(ToAbslStatus(stream->Finish(), "session"));
  return results;
}

TEST_F(WorkerGroupTest, SessionSpeaksPlainProtobufFramesToAnyClient) {
  const at::Tensor big = at::arange(1 << 18, at::kFloat);  // 1 MiB: streamed both ways
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto large, DataProto::Make({{"big", big}}));
  DRAY_ASSERT_OK_AND_ASSIGN(
      std::vector<DataProto> out,
      EchoOverTypedSession(group_->worker_addresses()[2], group_->job_secret(), {large, Batch(3)}));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(SameTensor(out[0].GetTensor("big").value(), big));
  EXPECT_THAT(Column(out[1], "x"), ElementsAre(0, 1, 2));
}

// A local process that found a worker's or the controller's port, but not
// the job's secret, can neither call, describe, stop, register nor beat.
TEST_F(WorkerGroupTest, StrangersWithoutTheJobSecretAreRefused) {
  const std::string worker = group_->worker_addresses()[1];
  for (const std::string& guess : {std::string(), std::string(64, '0')}) {
    EXPECT_THAT(CallOnce(worker, guess, "test", "echo", Batch(1)),
                StatusIs(absl::StatusCode::kUnauthenticated));
    EXPECT_THAT(EchoOverTypedSession(worker, guess, {Batch(1)}),
                StatusIs(absl::StatusCode::kUnauthenticated));
    auto stub = v1::WorkerService::NewStub(CreateDrayChannel(worker));
    grpc::ClientContext stop;
    SetDeadline(&stop, absl::Seconds(10));
    if (!guess.empty()) AttachJobSecret(&stop, guess);
    v1::ShutdownResponse stopped;
    EXPECT_EQ(stub->Shutdown(&stop, {}, &stopped).error_code(), grpc::StatusCode::UNAUTHENTICATED);

    auto controller =
        v1::ControllerService::NewStub(CreateDrayChannel(group_->controller_address()));
    grpc::ClientContext join;
    SetDeadline(&join, absl::Seconds(10));
    if (!guess.empty()) AttachJobSecret(&join, guess);
    v1::RegisterWorkerRequest registration;
    registration.set_rank(0);
    registration.set_address(worker);
    v1::RegisterWorkerResponse registered;
    EXPECT_EQ(controller->RegisterWorker(&join, registration, &registered).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    grpc::ClientContext beat;
    SetDeadline(&beat, absl::Seconds(10));
    v1::HeartbeatResponse alive;
    EXPECT_EQ(controller->Heartbeat(&beat, {}, &alive).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // Every worker still serves its group.
  DRAY_EXPECT_OK(group_->Health());
  DRAY_EXPECT_OK(group_->Call("identity", {}).status());
}

TEST(WorkerGroupProgressTest, ReportsReachTheCallerInOrderBeforeTheResult) {
  absl::Mutex mu;
  std::map<int, std::vector<std::string>> seen;  // by rank
  CallOptions call;
  call.on_progress = [&](int rank, const std::string& what, int64_t done, int64_t total) {
    absl::MutexLock lock(&mu);
    seen[rank].push_back(absl::StrCat(what, " ", done, "/", total));
  };
  DRAY_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WorkerGroup> group, StartGroup({1, 2}, {"test"}));
  DRAY_ASSERT_OK(group->Call("progress", {}, call).status());
  DRAY_ASSERT_OK(group->Call("progress", {}).status());  // no listener: reports are dropped
  absl::MutexLock lock(&mu);  // progress frames precede the result on each stream
  for (int rank : {0, 1}) {
    EXPECT_THAT(seen[rank], ::testing::ElementsAre("steps 1/3", "steps 2/3", "steps 3/3"))
        << "rank " << rank;
  }
}

// Cancellation: a call asked to stop ends between its units of work, with
// the reason it was given, and the workers serve on.
class WorkerGroupCancelTest : public ::testing::Test {
 protected:
  void SetUp() override { group_ = StartGroup({1, 2}, {"test"}).value(); }

  // StartCounting starts count_until_stopped and waits until every rank is
  // counting.
  GroupFuture StartCounting(bool together) {
    auto counting = std::make_shared<absl::BlockingCounter>(2);
    CallOptions call;
    call.timeout = absl::Minutes(2);
    call.on_progress = [counting](int, const std::string&, int64_t done, int64_t) {
      if (done == 1) counting->DecrementCount();
    };
    const DataProto input = DataProto::Make({}, {}, {{"together", together}}).value();
    GroupFuture future = group_->Invoke("count_until_stopped", {input}, call);
    counting->Wait();
    return future;
  }

  // LastStops: why each rank's latest count_until_stopped stopped.
  std::vector<std::string> LastStops() {
    const std::vector<DataProto> ranks = group_->Call("last_stop", {}).value();
    std::vector<std::string> stops;
    for (const DataProto& rank : ranks)
      stops.push_back(rank.GetMeta<std::string>("last_stop").value());
    return stops;
  }

  std::unique_ptr<WorkerGroup> group_;
};

TEST_F(WorkerGroupCancelTest, CancelStopsTheCallBetweenUnitsOfWork) {
  GroupFuture counting = StartCounting(/*together=*/false);
  counting.Cancel(absl::CancelledError("enough counting"));
  EXPECT_THAT(counting.Get(),
              StatusIs(absl::StatusCode::kCancelled,
                       AllOf(HasSubstr("count_until_stopped"), HasSubstr("enough counting"))));
  EXPECT_THAT(LastStops(), ElementsAre(HasSubstr("enough counting"), HasSubstr("enough counting")));
  DRAY_EXPECT_OK(group_->Health());
}

TEST_F(WorkerGroupCancelTest, CancelCallsStopsEveryPendingCall) {
  GroupFuture counting = StartCounting(/*together=*/false);
  group_->CancelCalls(absl::UnavailableError("shutting down"));
  EXPECT_THAT(counting.Get(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));
  DRAY_EXPECT_OK(group_->Call("identity", {}).status());
}

// The call's deadline ends it on the workers too, not only for its caller:
// last_stop, queued behind a count that never ends by itself, can only run
// once the count has stopped (or, on a slow machine, never started).
TEST_F(WorkerGroupCancelTest, TheDeadlineStopsTheCallOnTheWorkers) {
  const DataProto input = DataProto::Make({}, {}, {{"together", false}}).value();
  GroupFuture counting =
      group_->Invoke("count_until_stopped", {input}, CallOptions{absl::Milliseconds(500)});
  EXPECT_THAT(counting.Get(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(LastStops(), Each(AnyOf(IsEmpty(), HasSubstr("deadline passed"))));
}

// Ranks that run collectives in step stop together: a cancel that reaches
// rank 1 alone stops rank 0 as well, and the group's collectives still work.
TEST_F(WorkerGroupCancelTest, RanksInStepAgreeToStop) {
  GroupFuture counting = StartCounting(/*together=*/true);
  v1::CancelRequest cancel;
  cancel.set_call_id(1);  // the session's first call
  cancel.mutable_why()->set_code(static_cast<int>(absl::StatusCode::kCancelled));
  cancel.mutable_why()->set_message("only rank 1 was told");
  auto stub = v1::WorkerService::NewStub(CreateDrayChannel(group_->worker_addresses()[1]));
  v1::CancelResponse response;
  grpc::ClientContext stranger;
  SetDeadline(&stranger, absl::Seconds(10));
  EXPECT_EQ(stub->Cancel(&stranger, cancel, &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext controller;
  SetDeadline(&controller, absl::Seconds(10));
  AttachJobSecret(&controller, group_->job_secret());
  ASSERT_TRUE(stub->Cancel(&controller, cancel, &response).ok());
  EXPECT_THAT(counting.Get(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT(LastStops(), ElementsAre(HasSubstr("another rank of the group was asked to stop"),
                                       HasSubstr("only rank 1 was told")));
  DRAY_EXPECT_OK(group_->Call("all_reduce", {}).status());
}

TEST(WorkerGroupFailureTest, KilledWorkerFailsPendingCallsFast) {
  absl::Notification victim_sleeping;
  DRAY_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WorkerGroup> group, StartGroup({1, 4}, {"test"}));
  DRAY_EXPECT_OK(group->Health());
  // Far longer than the call's own deadline: only the death of rank 2 can end
  // the call with UNAVAILABLE before the deadline ends it otherwise.
  const DataProto slow = DataProto::Make({}, {}, {{"ms", int64_t{600000}}}).value();
  absl::StatusOr<std::vector<DataProto>> result;
  std::thread caller([&] {
    CallOptions call;
    call.timeout = absl::Minutes(2);
    call.on_progress = [&](int rank, const std::string& what, int64_t, int64_t) {
      if (rank == 2 && what == "sleep") victim_sleeping.Notify();  // once: one sleep per rank
    };
    result = group->Call("sleep", {slow}, call);
  });
  victim_sleeping.WaitForNotification();
  const pid_t victim = group->pids()[2];
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  caller.join();
  EXPECT_EQ(MappedSegments(), 0) << "nothing of the dead worker's stays mapped here";
  EXPECT_THAT(
      result,
      StatusIs(absl::StatusCode::kUnavailable,
               HasSubstr(absl::StrCat("worker rank 2 (pid ", victim, ") killed by signal 9"))));
  // Later calls fail at once, naming the dead rank.
  EXPECT_THAT(group->Call("identity", {}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("worker rank 2")));
  EXPECT_THAT(HealthOf(group->worker_addresses()[2]), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(group->Health(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("worker rank 2")));
  const std::vector<pid_t> pids = group->pids();
  group->Shutdown();
  for (pid_t pid : pids) EXPECT_FALSE(ProcessAlive(pid)) << pid;  // every process reaped
}

// A stopped worker (SIGSTOP) answers nothing: its silence fails the group,
// once, so that a supervisor can restart it; calls fail naming the rank.
TEST(WorkerGroupFailureTest, AStalledWorkerFailsTheGroupOnce) {
  WorkerGroupOptions options;
  options.heartbeat_interval = absl::Milliseconds(100);
  options.stall_timeout = absl::Seconds(1);
  absl::Mutex mu;
  std::vector<absl::Status> failures;
  absl::Notification failed;
  options.on_failure = [&](const absl::Status& cause) {
    absl::MutexLock lock(&mu);
    failures.push_back(cause);
    failed.Notify();
  };
  DRAY_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WorkerGroup> group,
                            StartGroup({1, 2}, {"test"}, options));
  const pid_t stalled = group->pids()[1];
  ASSERT_EQ(kill(stalled, SIGSTOP), 0);
  failed.WaitForNotification();
  EXPECT_THAT(group->Health(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(absl::StrCat("worker rank 1"))));
  EXPECT_THAT(group->Call("identity", {}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("worker rank 1")));
  const std::vector<pid_t> pids = group->pids();
  group->Shutdown();  // kills the stopped process too
  for (pid_t pid : pids) EXPECT_FALSE(ProcessAlive(pid)) << pid;
  absl::MutexLock lock(&mu);
  EXPECT_EQ(failures.size(), 1u);
}

TEST(WorkerGroupFailureTest, RegistrationTimeoutNamesTheMissingRanks) {
  WorkerGroupOptions options;
  options.command = {"/bin/sh", "-c", "sleep 30", "sh"};  // never registers
  options.roles = {"test"};
  options.register_timeout = absl::Seconds(1);
  EXPECT_THAT(WorkerGroup::Create({1, 2}, options),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("worker ranks 0, 1 did not register within 1s")));
}

TEST(WorkerGroupFailureTest, WorkerThatCannotStartFailsCreationWithItsExitStatus) {
  EXPECT_THAT(
      StartGroup({1, 2}, {"no_such_role"}),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("exited with code 1 before registering")));
  WorkerGroupOptions options;
  options.command = {"/nonexistent/worker"};
  options.roles = {"test"};
  EXPECT_THAT(WorkerGroup::Create({1, 1}, options),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("cannot run /nonexistent/worker")));
}

TEST(WorkerGroupFailureTest, MultiNodeLayoutSetsLocalRanks) {
  DRAY_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WorkerGroup> group, StartGroup({2, 2}, {"test"}));
  DRAY_ASSERT_OK_AND_ASSIGN(std::vector<DataProto> out, group->Call("identity", {}));
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(Meta(out[3], "rank"), 3);
  EXPECT_EQ(Meta(out[3], "local_rank"), 1);
  EXPECT_EQ(Meta(out[3], "local_world_size"), 2);
  EXPECT_EQ(out[2].GetMeta<std::string>("cuda_visible_devices").value(), "0");
}

TEST(WorkerGroupFailureTest, CallsAfterShutdownFail) {
  DRAY_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WorkerGroup> group, StartGroup({1, 1}, {"test"}));
  group->Shutdown();
  EXPECT_THAT(group->Call("identity", {}), StatusIs(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace dray
