// fsdp::optim::AdamW's update: each parameter's state, batched by device and dtype into calls of
// ATen's fused kernel.
#include <fsdp/fused_adamw.h>

#include "optim/fused_step.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace fsdp::optim {

namespace {

using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;

// A parameter's state, created as LibTorch's AdamW creates it on its first step.
AdamWParamState& state_of(torch::optim::AdamW& optimizer, const at::Tensor& p, bool amsgrad) {
  auto& slot = optimizer.state()[p.unsafeGetTensorImpl()];
  if (!slot) {
    auto state = std::make_unique<AdamWParamState>();
    state->step(0);
    state->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
    state->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
    if (amsgrad) state->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
    slot = std::move(state);
  }
  auto* adam = dynamic_cast<AdamWParamState*>(slot.get());
  TORCH_CHECK(adam, "fsdp::optim::AdamW: the state of a parameter is not AdamW's");
  fused::check_state_shape(adam->exp_avg(), p, "fsdp::optim::AdamW");
  return *adam;
}

}  // namespace

// [Note: step counts shared by count] in fused_adamw.h
at::Tensor AdamW::step_tensor(c10::Device device, int64_t count) {
  constexpr size_t kKept = 8;  // counts in use at once: one per step, a few after a partial load
  const std::thread::id thread = std::this_thread::get_id();
  std::lock_guard<std::mutex> lock(step_tensors_mutex_);
  for (const StepTensor& s : step_tensors_) {
    if (s.count == count && s.device == device && s.thread == thread) return s.tensor;
  }
  if (step_tensors_.size() >= kKept) step_tensors_.erase(step_tensors_.begin());
  at::Tensor tensor = at::full({1}, static_cast<double>(count), at::TensorOptions(at::kFloat).device(device));
  step_tensors_.push_back(StepTensor{thread, device, count, tensor});
  return tensor;
}

// Adds (param, grad) to the fused batch of its device and dtype, creating and counting its state.
void AdamW::add_to_batches(std::map<std::string, FusedBatch>& batches, const at::Tensor& p,
                           const at::Tensor& grad, bool amsgrad) {
  TORCH_CHECK(!grad.is_sparse(), "fsdp::optim::AdamW does not support sparse gradients");
  AdamWParamState& state = state_of(*this, p, amsgrad);
  state.step(state.step() + 1);
  FusedBatch& batch = batches[fused::batch_key(p)];
  batch.params.push_back(p);
  batch.grads.push_back(grad);
  batch.exp_avgs.push_back(state.exp_avg());
  batch.exp_avg_sqs.push_back(state.exp_avg_sq());
  if (amsgrad) batch.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
  batch.steps.push_back(step_tensor(p.device(), state.step()));
}

void AdamW::run_batches(std::map<std::string, FusedBatch>& batches, const AdamWOptions& options,
                        double scale) {
  for (auto& [key, batch] : batches) {
    const auto [beta1, beta2] = options.betas();
    at::_fused_adamw_(batch.params, batch.grads, batch.exp_avgs, batch.exp_avg_sqs,
                      batch.max_exp_avg_sqs, batch.steps, options.lr(), beta1, beta2,
                      options.weight_decay(), options.eps(), options.amsgrad(),
                      /*maximize=*/false, fused::grad_scale(scale, batch.params.front()));
  }
}

}  // namespace fsdp::optim
