// Activation checkpointing of a unit (paper, section 4.4): forward runs without recording a
// graph and keeps only the unit's inputs; backward runs the forward again with gradients on and
// backpropagates through it. FSDP's own hooks are untouched by the recomputation: the unit's
// pre-backward hook sits on the checkpoint's output and has unsharded the parameters before the
// recomputation starts; the recomputed graph accumulates into the same parameters' gradient
// accumulators, whose post-hooks reduce the gradient once, as without checkpointing.
#include <fsdp/unit_runtime.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

namespace fsdp::detail {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Forward = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

// The random generators a recomputation must replay (dropout): the CPU's, and the default
// generator of the inputs' device when that is another (a GPU's).
std::vector<at::Generator> generators_for(at::TensorList inputs) {
  std::vector<at::Generator> generators{at::detail::getDefaultCPUGenerator()};
  for (const auto& input : inputs) {
    if (input.defined() && !input.is_cpu()) {
      generators.push_back(at::globalContext().defaultGenerator(input.device()));
      break;
    }
  }
  return generators;
}

// What backward needs besides the inputs, carried through the autograd context.
struct Recomputation : torch::CustomClassHolder {
  Forward forward;
  std::vector<at::Generator> generators;
  std::vector<at::Tensor> rng_states;  // each generator's state when forward ran
};

// Restores the generators to `states` for its lifetime, then back to where they were.
class RngStateGuard {
 public:
  RngStateGuard(std::vector<at::Generator> generators, const std::vector<at::Tensor>& states)
      : generators_(std::move(generators)) {
    for (size_t i = 0; i < generators_.size(); ++i) {
      saved_.push_back(generators_[i].get_state());
      generators_[i].set_state(states[i]);
    }
  }
  ~RngStateGuard() {
    for (size_t i = 0; i < generators_.size(); ++i) generators_[i].set_state(saved_[i]);
  }

 private:
  std::vector<at::Generator> generators_;
  std::vector<at::Tensor> saved_;
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static at::Tensor forward(AutogradContext* ctx, const Forward& forward, at::TensorList inputs) {
    auto recomputation = c10::make_intrusive<Recomputation>();
    recomputation->forward = forward;
    recomputation->generators = generators_for(inputs);
    for (auto& generator : recomputation->generators) {
      recomputation->rng_states.push_back(generator.get_state());
    }
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
      RngStateGuard rng(recomputation->generators, recomputation->rng_states);
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
