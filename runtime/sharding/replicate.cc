#include "runtime/sharding/replicate.h"

#include <torch/csrc/autograd/grad_mode.h>

#include "base/status_macros.h"
#include "runtime/sharding/tensor_storage.h"

namespace dray {
namespace {

absl::Status BroadcastTensor(const at::Tensor& tensor, Communicator* comm, int root) {
  if (!HasStorage(tensor)) AllocateStorage(tensor);
  at::Tensor data = tensor.detach();
  return comm->Broadcast(data, root);
}

}  // namespace

absl::Status BroadcastModule(torch::nn::Module& module, Communicator* comm, int root) {
  torch::NoGradGuard no_grad;
  for (const at::Tensor& parameter : module.parameters())
    DRAY_RETURN_IF_ERROR(BroadcastTensor(parameter, comm, root));
  for (const at::Tensor& buffer : module.buffers())
    DRAY_RETURN_IF_ERROR(BroadcastTensor(buffer, comm, root));
  return absl::OkStatus();
}

int64_t ModuleBytes(const torch::nn::Module& module) {
  int64_t bytes = 0;
  for (const at::Tensor& parameter : module.parameters()) {
    if (HasStorage(parameter)) bytes += parameter.numel() * parameter.element_size();
  }
  return bytes;
}

}  // namespace dray
