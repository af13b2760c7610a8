// Communicator over LibTorch 1.13's c10d ProcessGroupGloo.
//
// Debian's Gloo lacks _allgather_base, reduce_scatter and bfloat16: AllGather
// gathers into views of the flat output, ReduceScatter is alltoall_base
// followed by a local sum (each rank receives every rank's copy of its part),
// and bfloat16 moves as float16 bit patterns (all-reduce goes through float32).
// AllToAll is alltoall_base.
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/exception_message.h"
#include "base/status_macros.h"
#include "runtime/collectives/collective_checks.h"
#include "runtime/collectives/communicator.h"
#include "runtime/collectives/rendezvous_store.h"

namespace dray {
namespace {

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// Transport views bfloat16 (which Debian's Gloo lacks, like int16) as
// float16 bit patterns, for collectives that move data without arithmetic.
at::Tensor Transport(const at::Tensor& tensor) {
  return tensor.scalar_type() == at::kBFloat16 ? tensor.view(at::kHalf) : tensor;
}

absl::Status CheckDense(const at::Tensor& tensor, absl::string_view what) {
  if (!tensor.defined() || tensor.layout() != at::kStrided || !tensor.is_contiguous() ||
      !tensor.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": Gloo needs a defined, dense, contiguous CPU tensor"));
  }
  return absl::OkStatus();
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<Rendezvous> rendezvous, std::string name, std::vector<int> ranks,
                   c10::intrusive_ptr<c10d::ProcessGroupGloo> group)
      : rendezvous_(std::move(rendezvous)),
        name_(std::move(name)),
        ranks_(std::move(ranks)),
        group_(std::move(group)) {}

  int rank() const override { return group_->getRank(); }
  int world_size() const override { return group_->getSize(); }

  absl::Status AllReduce(at::Tensor& tensor, ReduceOp op) override {
    DRAY_RETURN_IF_ERROR(CheckDense(tensor, "all_reduce"));
    if (tensor.scalar_type() == at::kBFloat16) {  // reduce in float32, store back
      at::Tensor wide = tensor.to(at::kFloat);
      DRAY_RETURN_IF_ERROR(AllReduce(wide, op));
      tensor.copy_(wide);
      return absl::OkStatus();
    }
    std::vector<at::Tensor> tensors = {tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = op == ReduceOp::kSum   ? c10d::ReduceOp::SUM
                       : op == ReduceOp::kMin ? c10d::ReduceOp::MIN
                                              : c10d::ReduceOp::MAX;
    return Wait("all_reduce", [&] { return group_->allreduce(tensors, options); });
  }

  absl::Status Broadcast(at::Tensor& tensor, int root) override {
    DRAY_RETURN_IF_ERROR(CheckDense(tensor, "broadcast"));
    DRAY_RETURN_IF_ERROR(CheckRoot("broadcast", root, world_size()));
    std::vector<at::Tensor> tensors = {Transport(tensor)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    return Wait("broadcast", [&] { return group_->broadcast(tensors, options); });
  }

  absl::Status AllGather(const at::Tensor& input, at::Tensor& output) override {
    DRAY_RETURN_IF_ERROR(CheckDense(input, "all_gather input"));
    DRAY_RETURN_IF_ERROR(CheckDense(output, "all_gather output"));
    DRAY_RETURN_IF_ERROR(CheckParts("all_gather", input, output, world_size()));
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (const at::Tensor& part : Transport(output).view({-1}).chunk(world_size())) {
      outputs[0].push_back(part.view(input.sizes()));
    }
    std::vector<at::Tensor> inputs = {Transport(input)};
    return Wait("all_gather", [&] { return group_->allgather(outputs, inputs); });
  }

  absl::Status ReduceScatter(const at::Tensor& input, at::Tensor& output) override {
    DRAY_RETURN_IF_ERROR(CheckDense(input, "reduce_scatter input"));
    DRAY_RETURN_IF_ERROR(CheckDense(output, "reduce_scatter output"));
    DRAY_RETURN_IF_ERROR(CheckParts("reduce_scatter", output, input, world_size()));
    at::Tensor received = at::empty({input.numel()}, input.options());
    at::Tensor flat_input = Transport(input.view({-1}));
    at::Tensor transport_received = Transport(received);
    std::vector<int64_t> even_splits;
    DRAY_RETURN_IF_ERROR(Wait("reduce_scatter", [&] {
      return group_->alltoall_base(transport_received, flat_input, even_splits, even_splits);
    }));
    output.view({-1}).copy_(at::sum(received.view({world_size(), -1}), 0));
    return absl::OkStatus();
  }

  absl::Status AllToAll(const at::Tensor& input, at::Tensor& output) override {
    DRAY_RETURN_IF_ERROR(CheckDense(input, "all_to_all input"));
    DRAY_RETURN_IF_ERROR(CheckDense(output, "all_to_all output"));
    DRAY_RETURN_IF_ERROR(CheckAllToAll(input, output, world_size()));
    at::Tensor flat_input = Transport(input.view({-1}));
    at::Tensor flat_output = Transport(output.view({-1}));
    std::vector<int64_t> even_splits;
    return Wait("all_to_all", [&] {
      return group_->alltoall_base(flat_output, flat_input, even_splits, even_splits);
    });
  }

  absl::Status Barrier() override {
    return Wait("barrier", [&] { return group_->barrier(); });
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Subgroup(const std::vector<int>& ranks,
                                                         const std::string& name) override {
    std::vector<int> global;
    for (int rank : ranks) global.push_back(ranks_.at(rank));
    return CreateGlooCommunicator(rendezvous_, absl::StrCat(name_, "/", UniqueSubgroupName(name)),
                                  global);
  }

 private:
  // Wait starts a collective and waits for it, turning c10 errors (a peer
  // gone, a timeout) into UNAVAILABLE naming the collective.
  template <typename Start>
  absl::Status Wait(absl::string_view what, Start start) {
    try {
      start()->wait();
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat(what, " failed on rank ", rank(), ": ", ExceptionMessage(e)));
    }
  }

  std::shared_ptr<Rendezvous> rendezvous_;
  std::string name_;
  std::vector<int> ranks_;  // rendezvous ranks of this group's members, by group rank
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
};

}  // namespace

// kGlooAttempts: how many times the members make a group together before
// giving up. Gloo's TCP handshake can fail under load ("Connection closed by
// peer", seen with many groups forming at once on one host); one rank's
// failure fails the group, so all of them try again, each attempt under a
// store prefix of its own.
constexpr int kGlooAttempts = 3;

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    std::shared_ptr<Rendezvous> rendezvous, const std::string& name, std::vector<int> ranks) {
  const GroupAddress& address = rendezvous->address();
  DRAY_ASSIGN_OR_RETURN(ranks, GroupRanks(address, std::move(ranks)));
  const int group_rank =
      static_cast<int>(std::find(ranks.begin(), ranks.end(), address.rank) - ranks.begin());
  const c10::intrusive_ptr<c10d::Store>& shared = rendezvous->store().store;
  std::string failure;
  for (int attempt = 0; attempt < kGlooAttempts; ++attempt) {
    const std::string prefix =
        absl::StrCat("gloo/", name, "/", absl::StrJoin(ranks, ","), "/", attempt);
    c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
    try {
      auto options = c10d::ProcessGroupGloo::Options::create(ToChrono(address.timeout));
      options->devices.push_back(
          c10d::ProcessGroupGloo::createDeviceForHostname(address.local_addr()));
      group = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>(prefix, shared), group_rank,
          static_cast<int>(ranks.size()), options);
    } catch (const std::exception& e) {
      failure = ExceptionMessage(e);
    }
    // Every member says how it went and hears from the others.
    bool everyone = true;
    try {
      const std::string joined = group ? "ok" : "failed";
      shared->set(absl::StrCat(prefix, "/joined/", group_rank),
                  std::vector<uint8_t>(joined.begin(), joined.end()));
      for (size_t member = 0; member < ranks.size(); ++member) {
        const std::vector<uint8_t> said = shared->get(absl::StrCat(prefix, "/joined/", member));
        everyone = everyone && std::string(said.begin(), said.end()) == "ok";
      }
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat(
          "rank ", address.rank, " could not join Gloo group '", name, "': ", ExceptionMessage(e)));
    }
    if (everyone) {
      return std::unique_ptr<Communicator>(
          new GlooCommunicator(std::move(rendezvous), name, ranks, group));
    }
    if (failure.empty()) failure = "another member could not connect";
  }
  return absl::UnavailableError(absl::StrCat("rank ", address.rank, " could not join Gloo group '",
                                             name, "' in ", kGlooAttempts, " attempts: ", failure));
}

}  // namespace dray
