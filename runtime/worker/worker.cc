#include "runtime/worker/worker.h"

#include <cstdlib>

#include <ATen/ops/full.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace dray {
namespace {

absl::Status ReadInt(const char* name, int* value) {
  const char* text = std::getenv(name);
  if (text == nullptr) return absl::OkStatus();
  if (!absl::SimpleAtoi(text, value) || *value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "='", text, "' is not a non-negative integer"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<WorkerContext> WorkerContext::FromEnvironment() {
  WorkerContext context;
  for (auto [name, field] :
       {std::pair{"RANK", &context.rank}, std::pair{"WORLD_SIZE", &context.world_size},
        std::pair{"LOCAL_RANK", &context.local_rank},
        std::pair{"LOCAL_WORLD_SIZE", &context.local_world_size},
        std::pair{"MASTER_PORT", &context.master_port}}) {
    absl::Status status = ReadInt(name, field);
    if (!status.ok()) return status;
  }
  if (const char* addr = std::getenv("MASTER_ADDR")) context.master_addr = addr;
  if (const char* file = std::getenv("DRAY_STORE_FILE")) context.store_file = file;
  if (const char* node = std::getenv("DRAY_NODE_ADDR")) context.node_addr = node;
  if (context.world_size < 1 || context.rank >= context.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("RANK=", context.rank, " is not below WORLD_SIZE=", context.world_size));
  }
  return context;
}

Worker::Worker() {
  // A malformed environment is reported by the worker process before any
  // worker is built; a worker built elsewhere (a unit test) is a lone rank.
  context_ = WorkerContext::FromEnvironment().value_or(WorkerContext());
}

Worker::~Worker() = default;

absl::StatusOr<std::shared_ptr<Rendezvous>> Worker::rendezvous() {
  if (rendezvous_ == nullptr) {
    GroupAddress address;
    address.rank = context_.rank;
    address.world_size = context_.world_size;
    address.master_addr = context_.master_addr;
    address.master_port = context_.master_port;
    address.store_file = context_.store_file;
    address.node_addr = context_.node_addr;
    DRAY_ASSIGN_OR_RETURN(rendezvous_, Rendezvous::Join(address));
  }
  return rendezvous_;
}

absl::StatusOr<Communicator*> Worker::comm() {
  if (comm_ == nullptr) {
    DRAY_ASSIGN_OR_RETURN(std::shared_ptr<Rendezvous> group, rendezvous());
    DRAY_ASSIGN_OR_RETURN(comm_, CreateGlooCommunicator(std::move(group), "default"));
  }
  return comm_.get();
}

absl::StatusOr<Communicator*> Worker::device_comm() {
  if (device_comm_ == nullptr) {
    DRAY_ASSIGN_OR_RETURN(std::shared_ptr<Rendezvous> group, rendezvous());
    // The controller sets CUDA_VISIBLE_DEVICES to this worker's GPU: device 0.
    DRAY_ASSIGN_OR_RETURN(device_comm_, CreateNcclCommunicator(std::move(group), "default", 0));
  }
  return device_comm_.get();
}

absl::Status Worker::StopRequestedOnAnyRank(Communicator* among) {
  absl::Status stop = StopRequested();
  Communicator* group = among;
  if (group == nullptr) {
    if (world_size() == 1) return stop;
    DRAY_ASSIGN_OR_RETURN(group, comm());
  }
  at::Tensor code = at::full({1}, static_cast<int64_t>(stop.code()), at::kLong);
  DRAY_RETURN_IF_ERROR(group->AllReduce(code, ReduceOp::kMax));
  const auto agreed = static_cast<absl::StatusCode>(code.item<int64_t>());
  if (!stop.ok() || agreed == absl::StatusCode::kOk) return stop;
  return absl::Status(agreed, "another rank of the group was asked to stop");
}

void WorkerClassRegistry::Add(std::string role, Factory factory) {
  factories_[std::move(role)] = std::move(factory);
}

absl::StatusOr<std::unique_ptr<Worker>> WorkerClassRegistry::Create(absl::string_view role) const {
  auto it = factories_.find(role);
  if (it == factories_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "no worker class '", role, "'; this binary hosts: ", absl::StrJoin(roles(), ", ")));
  }
  return it->second();
}

std::vector<std::string> WorkerClassRegistry::roles() const {
  std::vector<std::string> roles;
  for (const auto& entry : factories_) roles.push_back(entry.first);
  return roles;
}

}  // namespace dray
