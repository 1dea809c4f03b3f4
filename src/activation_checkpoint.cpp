// Activation checkpointing of a unit (paper, section 4.4): forward runs without recording a
// graph and keeps only the unit's inputs; backward runs the forward again with gradients on and
// backpropagates through it. FSDP's own hooks are untouched by the recomputation: the unit's
// pre-backward hook sits on the checkpoint's output and has unsharded the parameters before the
// recomputation starts; the recomputed graph accumulates into the same parameters' gradient
// accumulators, whose post-hooks reduce the gradient once, as without checkpointing.
#include <fsdp/fully_shard.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

namespace fsdp::detail {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Forward = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

// What backward needs besides the inputs, carried through the autograd context.
struct Recomputation : torch::CustomClassHolder {
  Forward forward;
  at::Tensor rng_state;  // the CPU generator's state when forward ran (dropout replays it)
};

// Restores the CPU generator to `state` for its lifetime, then back to where it was.
class RngStateGuard {
 public:
  explicit RngStateGuard(const at::Tensor& state)
      : generator_(at::detail::getDefaultCPUGenerator()), saved_(generator_.get_state()) {
    generator_.set_state(state);
  }
  ~RngStateGuard() { generator_.set_state(saved_); }

 private:
  at::Generator generator_;
  at::Tensor saved_;
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static at::Tensor forward(AutogradContext* ctx, const Forward& forward, at::TensorList inputs) {
    auto recomputation = c10::make_intrusive<Recomputation>();
    recomputation->forward = forward;
    recomputation->rng_state = at::detail::getDefaultCPUGenerator().get_state();
    ctx->saved_data["recomputation"] = c10::IValue::make_capsule(recomputation);
    ctx->save_for_backward(inputs.vec());
    return forward(inputs.vec());  // autograd functions run forward with gradients off
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto recomputation = c10::static_intrusive_pointer_cast<Recomputation>(
        ctx->saved_data["recomputation"].toCapsule());
    variable_list inputs;
    for (const auto& saved : ctx->get_saved_variables()) {
      inputs.push_back(saved.defined() ? saved.detach().requires_grad_(saved.requires_grad())
                                       : saved);
    }
    at::Tensor output;
    {
      RngStateGuard rng(recomputation->rng_state);
      at::AutoGradMode grad_mode(true);
      output = recomputation->forward(inputs);
    }
    if (output.requires_grad()) torch::autograd::backward({output}, {grad_outputs[0]});
    variable_list input_grads{at::Tensor()};  // for `forward`, which is not a tensor
    for (const auto& input : inputs) {
      input_grads.push_back(input.defined() && input.requires_grad() ? input.grad() : at::Tensor());
    }
    return input_grads;
  }
};

}  // namespace

at::Tensor run_checkpointed(Forward forward, std::vector<at::Tensor> inputs) {
  if (!at::GradMode::is_enabled()) return forward(inputs);  // nothing to save for
  // Makes the output require gradients even when no input does (data fed to a first unit):
  // the parameters' gradients come only through this function's backward.
  inputs.push_back(at::empty({0}).requires_grad_(true));
  // A TensorList, not a vector: autograd counts only tensors and tensor lists as inputs.
  return CheckpointFunction::apply(forward, at::TensorList(inputs));
}

}  // namespace fsdp::detail
