#include <fsdp/fused_adamw.h>

#include "comm/comm_thread.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <map>
#include <optional>
#include <string>

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
  return *adam;
}

}  // namespace

const at::Tensor& AdamW::device_step(const at::Tensor& param, int64_t count) {
  DeviceStep& entry = device_steps_[param.unsafeGetTensorImpl()];
  if (!entry.tensor.defined() || entry.tensor.device() != param.device()) {
    entry.tensor = at::empty({1}, param.options().dtype(at::kFloat));
    entry.step = -1;
  }
  if (entry.step != count - 1) {
    entry.tensor.fill_(static_cast<double>(count - 1));  // the kernel's caller adds the 1 below
  }
  entry.step = count;
  return entry.tensor;
}

// Adds (param, grad) to the fused batch of its device and dtype, creating and counting its state.
void AdamW::add_to_batches(std::map<std::string, FusedBatch>& batches, const at::Tensor& p,
                           const at::Tensor& grad, bool amsgrad) {
  TORCH_CHECK(!grad.is_sparse(), "fsdp::optim::AdamW does not support sparse gradients");
  AdamWParamState& state = state_of(*this, p, amsgrad);
  state.step(state.step() + 1);
  FusedBatch& batch = batches[p.device().str() + "/" + c10::toString(p.scalar_type())];
  batch.params.push_back(p);
  batch.grads.push_back(grad);
  batch.exp_avgs.push_back(state.exp_avg());
  batch.exp_avg_sqs.push_back(state.exp_avg_sq());
  if (amsgrad) batch.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
  batch.steps.push_back(device_step(p, state.step()));
}

void AdamW::run_batches(std::map<std::string, FusedBatch>& batches, const AdamWOptions& options,
                        double scale) {
  for (auto& [key, batch] : batches) {
    at::_foreach_add_(batch.steps, 1);  // as PyTorch's fused AdamW: the kernel reads step + 1
    const auto [beta1, beta2] = options.betas();
    std::optional<at::Tensor> grad_scale;
    if (scale != 0) grad_scale = at::full({1}, scale, batch.params.front().options().dtype(at::kFloat));
    at::_fused_adamw_(batch.params, batch.grads, batch.exp_avgs, batch.exp_avg_sqs,
                      batch.max_exp_avg_sqs, batch.steps, options.lr(), beta1, beta2,
                      options.weight_decay(), options.eps(), options.amsgrad(),
                      /*maximize=*/false, grad_scale);
  }
}

AdamW::~AdamW() {
  try {
    wait_queued_steps();
  } catch (const std::exception&) {  // a destructor does not throw; step() would have
  }
}

torch::Tensor AdamW::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure) {
    wait_queued_steps();
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  step_remaining(/*scale=*/0);
  return loss;
}

void AdamW::step_scaled(double scale) {
  TORCH_CHECK(scale > 0, "fsdp::optim::AdamW::step_scaled: the scale must be positive, got ", scale);
  step_remaining(scale);
}

void AdamW::step_remaining(double scale) {
  wait_queued_steps();
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const AdamWOptions&>(group.options());
    std::map<std::string, FusedBatch> batches;  // by device and dtype
    for (auto& p : group.params()) {
      if (!p.grad().defined() || stepped_.count(p.unsafeGetTensorImpl())) continue;
      add_to_batches(batches, p, p.grad(), options.amsgrad());
    }
    run_batches(batches, options, scale);
  }
  stepped_.clear();
}

void AdamW::step_parameters(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) {
  TORCH_CHECK(params.size() == grads.size(), "fsdp::optim::AdamW::step_parameters: ", params.size(),
              " parameters but ", grads.size(), " gradients");
  std::unordered_map<void*, const at::Tensor*> grad_of;
  for (size_t i = 0; i < params.size(); ++i) grad_of[params[i].unsafeGetTensorImpl()] = &grads[i];
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const AdamWOptions&>(group.options());
    std::map<std::string, FusedBatch> batches;
    for (auto& p : group.params()) {
      const auto it = grad_of.find(p.unsafeGetTensorImpl());
      if (it == grad_of.end() || stepped_.count(it->first)) continue;
      add_to_batches(batches, p, *it->second, options.amsgrad());
      stepped_.insert(it->first);
    }
    run_batches(batches, options);
  }
}

void AdamW::step_when_ready(std::vector<at::Tensor> params, std::vector<at::Tensor> grads,
                            std::function<void()> ready) {
  if (!worker_) worker_ = std::make_shared<CommThread>();
  last_queued_ = std::make_shared<CommHandle>(worker_->submit(
      [this, params = std::move(params), grads = std::move(grads), ready = std::move(ready)] {
        ready();
        step_parameters(params, grads);
      }));
}

void AdamW::wait_queued_steps() {
  if (!last_queued_) return;
  const std::shared_ptr<CommHandle> last = std::move(last_queued_);
  last->wait();  // in order: the last one's end is every one's; a failure fails every later one
}

StepInBackward::StepInBackward(std::shared_ptr<FsdpState> state, AdamW& optimizer) : state_(std::move(state)) {
  TORCH_CHECK(state_, "StepInBackward: the model is not sharded (call fully_shard)");
  detail::set_gradients_reduced_hook(
      *state_, [&optimizer](std::vector<at::Tensor> params, std::vector<at::Tensor> grads,
                            std::function<void()> wait) {
        optimizer.step_when_ready(std::move(params), std::move(grads), std::move(wait));
      });
}

StepInBackward::~StepInBackward() { detail::set_gradients_reduced_hook(*state_, nullptr); }

}  // namespace fsdp::optim
