#include "runtime/sharding/activation_checkpoint.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

namespace dray {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// FunctionHolder keeps the unit's function alive in the autograd context.
struct FunctionHolder : public torch::CustomClassHolder {
  explicit FunctionHolder(UnitFunction fn) : fn(std::move(fn)) {}
  UnitFunction fn;
};

struct Checkpointed : public torch::autograd::Function<Checkpointed> {
  // `inputs` is a TensorList so that autograd sees its tensors as inputs (a
  // std::vector would pass as an opaque argument). `anchor`: an empty tensor
  // that requires grad, so that the outputs do when no input does.
  static variable_list forward(AutogradContext* ctx, UnitFunction fn, at::TensorList inputs,
                               const at::Tensor& anchor) {
    const variable_list tensors(inputs.begin(), inputs.end());
    ctx->save_for_backward(tensors);
    ctx->saved_data["fn"] = at::IValue::make_capsule(c10::make_intrusive<FunctionHolder>(fn));
    at::NoGradGuard no_grad;  // no activations are kept
    return fn(tensors);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    variable_list inputs;
    for (const at::Tensor& input : saved) {
      inputs.push_back(input.detach().requires_grad_(input.requires_grad()));
    }
    const UnitFunction& fn =
        static_cast<FunctionHolder*>(ctx->saved_data["fn"].toCapsule().get())->fn;
    variable_list outputs;
    {
      at::AutoGradMode enable(true);
      outputs = fn(inputs);  // recompute, this time recording the graph
    }
    variable_list with_grad, grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        with_grad.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    // Parameters accumulate their gradients here; inputs' gradients go up.
    if (!with_grad.empty()) torch::autograd::backward(with_grad, grads);
    variable_list input_grads = {at::Tensor()};  // for `fn`, then one per input tensor
    for (const at::Tensor& input : inputs)
      input_grads.push_back(input.requires_grad() ? input.grad() : at::Tensor());
    input_grads.push_back(at::Tensor());  // the anchor's
    return input_grads;
  }
};

}  // namespace

std::vector<at::Tensor> CheckpointedForward(UnitFunction fn,
                                            const std::vector<at::Tensor>& inputs) {
  const at::Tensor anchor = at::empty({0}).requires_grad_();
  return Checkpointed::apply(std::move(fn), at::TensorList(inputs), anchor);
}

}  // namespace dray
