// A worker process for the runtime's integration tests: worker classes that
// exercise every dispatch and execute mode, errors, slow calls, collectives
// and colocated roles.
#include <unistd.h>

#include <ATen/ops/full.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/worker/worker.h"
#include "runtime/worker/worker_process.h"

namespace dray {
namespace {

std::string Hostname() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// WithRank returns `input` with a "rank" column naming who processed each row.
absl::StatusOr<DataProto> WithRank(const DataProto& input, int rank) {
  DataProto output = input;
  DRAY_RETURN_IF_ERROR(output.AddNonTensor("rank", std::vector<int64_t>(input.size(), rank)));
  return output;
}

class TestWorker : public Worker {
 public:
  TestWorker() {
    Def("identity", &TestWorker::Identity, {kOneToAll});
    Def("echo", &TestWorker::Echo, {kDpComputeProto});
    Def("echo_async", &TestWorker::Echo, {kDpComputeProto, ExecuteMode::kAll, /*blocking=*/false});
    Def("metric", &TestWorker::Echo, {kDpComputeMetric});
    Def("per_rank", &TestWorker::Echo, {kDpCompute});
    Def("all_to_all", &TestWorker::Echo, {kAllToAll});
    Def("rank_zero", &TestWorker::Identity, {kRankZero});
    Def("identity_on_rank_zero", &TestWorker::Identity, {kOneToAll, ExecuteMode::kRankZero});
    Def("drop_rows", &TestWorker::DropRows, {kDpComputeProto});
    Def("fail_on_rank_one", &TestWorker::FailOnRankOne, {kOneToAll});
    Def("throw", &TestWorker::Throw, {kOneToAll});
    Def("sleep", &TestWorker::Sleep, {kOneToAll});
    Def("wait_for_file", &TestWorker::WaitForFile,
        {kOneToAll, ExecuteMode::kAll, /*blocking=*/false});
    Def("append", &TestWorker::Append, {kOneToAll, ExecuteMode::kAll, /*blocking=*/false});
    Def("all_reduce", &TestWorker::AllReduce, {kOneToAll});
    Def("print", &TestWorker::Print, {kOneToAll});
    Def("progress", &TestWorker::Progress, {kOneToAll});
    Def("count_until_stopped", &TestWorker::CountUntilStopped,
        {kOneToAll, ExecuteMode::kAll, /*blocking=*/false});
    Def("last_stop", &TestWorker::LastStop, {kOneToAll});
  }

  absl::StatusOr<DataProto> Identity() {
    const char* devices = std::getenv("CUDA_VISIBLE_DEVICES");
    return DataProto::Make({}, {},
                           {{"rank", int64_t{rank()}},
                            {"world_size", int64_t{world_size()}},
                            {"local_rank", int64_t{local_rank()}},
                            {"local_world_size", int64_t{local_world_size()}},
                            {"master_addr", context().master_addr},
                            {"store_file", context().store_file},
                            {"node_addr", context().node_addr},
                            {"hostname", Hostname()},
                            {"cuda_visible_devices", std::string(devices ? devices : "")},
                            {"pid", int64_t{getpid()}}});
  }

  absl::StatusOr<DataProto> Echo(const DataProto& input) { return WithRank(input, rank()); }

  absl::StatusOr<DataProto> DropRows(const DataProto&) { return DataProto(); }

  absl::StatusOr<DataProto> FailOnRankOne() {
    if (rank() == 1) return absl::FailedPreconditionError("rank one refuses");
    return DataProto();
  }

  absl::StatusOr<DataProto> Throw() { throw std::runtime_error("something broke"); }

  // Sleep reports progress "sleep" 0 of 1 (so a test knows it has begun),
  // waits meta "ms" milliseconds, then returns its pid.
  absl::StatusOr<DataProto> Sleep(const DataProto& input) {
    DRAY_ASSIGN_OR_RETURN(int64_t ms, input.GetMeta<int64_t>("ms"));
    ReportProgress("sleep", 0, 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return DataProto::Make({}, {}, {{"pid", int64_t{getpid()}}});
  }

  // WaitForFile returns once the file at meta "path" exists (at most 30 s).
  absl::StatusOr<DataProto> WaitForFile(const DataProto& input) {
    DRAY_ASSIGN_OR_RETURN(std::string path, input.GetMeta<std::string>("path"));
    for (int i = 0; i < 3000; ++i) {
      if (access(path.c_str(), F_OK) == 0) return DataProto();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return absl::DeadlineExceededError(absl::StrCat(path, " never appeared"));
  }

  // Append records meta "seq" and returns every value recorded so far.
  absl::StatusOr<DataProto> Append(const DataProto& input) {
    DRAY_ASSIGN_OR_RETURN(int64_t seq, input.GetMeta<int64_t>("seq"));
    seen_.push_back(seq);
    return DataProto::Make({}, {{"seen", seen_}});
  }

  // AllReduce sums rank+1 over the group with Gloo.
  absl::StatusOr<DataProto> AllReduce() {
    DRAY_ASSIGN_OR_RETURN(Communicator * comm, comm());
    at::Tensor value = at::full({3}, static_cast<double>(rank() + 1), at::kDouble);
    DRAY_RETURN_IF_ERROR(comm->AllReduce(value));
    return DataProto::Make({{"sum", value.unsqueeze(0)}});
  }

  // Progress reports steps 1..3 of "steps".
  absl::StatusOr<DataProto> Progress() {
    for (int step = 1; step <= 3; ++step) ReportProgress("steps", step, 3);
    return DataProto();
  }

  // CountUntilStopped does units of work (reporting the first as progress
  // "count" 1) until StopRequested (meta "together": StopRequestedOnAnyRank)
  // says to stop, and returns why, which LastStop then tells.
  absl::StatusOr<DataProto> CountUntilStopped(const DataProto& input) {
    const bool together = input.GetMeta<bool>("together").value_or(false);
    at::Tensor work = at::full({32, 32}, 0.5, at::kFloat);
    for (int64_t count = 1;; ++count) {
      if (count == 1) ReportProgress("count", count, 0);
      work = work.matmul(work).clamp(0, 1);  // a unit of work
      const absl::Status stop = together ? StopRequestedOnAnyRank() : StopRequested();
      if (!stop.ok()) {
        last_stop_ = stop.ToString();
        return stop;
      }
    }
  }

  absl::StatusOr<DataProto> LastStop() {
    return DataProto::Make({}, {}, {{"last_stop", last_stop_}});
  }

  absl::StatusOr<DataProto> Print() {
    std::printf("hello from stdout\n");
    std::fflush(stdout);
    std::fprintf(stderr, "hello from stderr\n");
    return DataProto();
  }

 private:
  std::vector<int64_t> seen_;
  std::string last_stop_;
};

// OtherWorker is colocated with TestWorker in the same processes.
class OtherWorker : public Worker {
 public:
  OtherWorker() {
    Def("role", &OtherWorker::Role, {kOneToAll});
    Def("echo", &OtherWorker::Echo, {kOneToAll});
  }
  absl::StatusOr<DataProto> Role() {
    return DataProto::Make({}, {}, {{"role", std::string("other")}});
  }
  absl::StatusOr<DataProto> Echo(const DataProto& input) { return input; }
};

}  // namespace
}  // namespace dray

int main(int argc, char** argv) {
  dray::WorkerClassRegistry classes;
  classes.Add<dray::TestWorker>("test");
  classes.Add<dray::OtherWorker>("other");
  return dray::WorkerMain(classes, argc, argv);
}
