// fsdp::optim::SGD's steps: step() and step_scaled() step every parameter with a gradient that
// step_parameters (the steps queued in backward) has not stepped since the last step().
#include <fsdp/fused_sgd.h>

#include "optim/fused_step.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace fsdp::optim {

using torch::optim::SGDOptions;
using torch::optim::SGDParamState;

SGD::~SGD() { finish_queued_steps(); }

torch::Tensor SGD::step(LossClosure closure) {
  if (closure) wait_queued_steps();
  torch::Tensor loss = fused::loss_of(closure);
  step_remaining(/*scale=*/0);
  return loss;
}

void SGD::step_scaled(double scale) {
  fused::check_scale(scale, "fsdp::optim::SGD");
  step_remaining(scale);
}

// Adds p to the batch of its device, dtype and whether its momentum buffer is new (created here,
// as LibTorch's SGD creates it on a parameter's first step with momentum).
void SGD::add_to_batches(std::map<std::string, FusedBatch>& batches, const at::Tensor& p,
                         const at::Tensor& grad, double momentum) {
  TORCH_CHECK(!grad.is_sparse(), "fsdp::optim::SGD does not support sparse gradients");
  at::Tensor buffer;
  bool first_step = false;
  if (momentum != 0) {
    auto& slot = state()[p.unsafeGetTensorImpl()];
    if (!slot) {
      auto fresh = std::make_unique<SGDParamState>();
      fresh->momentum_buffer(at::empty_like(p, at::MemoryFormat::Preserve));
      slot = std::move(fresh);
      first_step = true;
    }
    auto* sgd = dynamic_cast<SGDParamState*>(slot.get());
    TORCH_CHECK(sgd, "fsdp::optim::SGD: the state of a parameter is not SGD's");
    buffer = sgd->momentum_buffer();
    if (buffer.defined()) fused::check_state_shape(buffer, p, "fsdp::optim::SGD");
  }
  FusedBatch& batch = batches[fused::batch_key(p) + (first_step ? "/first" : "")];
  batch.first_step = first_step;
  batch.params.push_back(p);
  batch.grads.push_back(grad);
  if (buffer.defined()) batch.momentum_buffers.push_back(buffer);
}

void SGD::run_batches(std::map<std::string, FusedBatch>& batches, const SGDOptions& o, double scale) {
  for (auto& [key, batch] : batches) {
    at::_fused_sgd_(batch.params, batch.grads, batch.momentum_buffers, o.weight_decay(), o.momentum(),
                    o.lr(), o.dampening(), o.nesterov(), /*maximize=*/false, batch.first_step,
                    fused::grad_scale(scale, batch.params.front()));
  }
}

void SGD::step_remaining(double scale) {
  wait_queued_steps();
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const SGDOptions&>(group.options());
    std::map<std::string, FusedBatch> batches;
    for (auto& p : group.params()) {
      if (p.grad().defined() && !stepped_in_backward(p)) add_to_batches(batches, p, p.grad(), o.momentum());
    }
    run_batches(batches, o, scale);
  }
  forget_stepped();
}

void SGD::step_parameters(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) {
  const auto grad_of = claim_gradients(params, grads);
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const SGDOptions&>(group.options());
    std::map<std::string, FusedBatch> batches;
    for (auto& p : group.params()) {
      const auto it = grad_of.find(p.unsafeGetTensorImpl());
      if (it != grad_of.end()) add_to_batches(batches, p, it->second, o.momentum());
    }
    run_batches(batches, o, /*scale=*/0);
  }
}

}  // namespace fsdp::optim
