// fsdp::optim::AdamW's steps: step() and step_scaled() step every parameter with a gradient that
// step_parameters (the steps queued in backward) has not stepped since the last step().
#include <fsdp/fused_adamw.h>

#include "optim/fused_step.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>


namespace fsdp::optim {

using torch::optim::AdamWOptions;

AdamW::~AdamW() { finish_queued_steps(); }

torch::Tensor AdamW::step(LossClosure closure) {
  if (closure) wait_queued_steps();
  torch::Tensor loss = fused::loss_of(closure);
  step_remaining(/*scale=*/0);
  return loss;
}

void AdamW::step_scaled(double scale) {
  fused::check_scale(scale, "fsdp::optim::AdamW");
  step_remaining(scale);
}

void AdamW::step_remaining(double scale) {
  wait_queued_steps();
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const AdamWOptions&>(group.options());
    std::map<std::string, FusedBatch> batches;  // by device and dtype
    for (auto& p : group.params()) {
      if (!p.grad().defined() || stepped_in_backward(p)) continue;
      add_to_batches(batches, p, p.grad(), options.amsgrad());
    }
    run_batches(batches, options, scale);
  }
  forget_stepped();
}

void AdamW::step_parameters(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) {
  const auto grad_of = claim_gradients(params, grads);
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const AdamWOptions&>(group.options());
    std::map<std::string, FusedBatch> batches;
    for (auto& p : group.params()) {
      const auto it = grad_of.find(p.unsafeGetTensorImpl());
      if (it == grad_of.end()) continue;
      add_to_batches(batches, p, it->second, options.amsgrad());
    }
    run_batches(batches, options);
  }
}

}  // namespace fsdp::optim
