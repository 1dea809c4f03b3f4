#include <fsdp/fused_adamw.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <map>
#include <string>

namespace fsdp::optim {

namespace {

using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;

/// The tensors of one kernel call: one device, one dtype, one param group's options.
struct FusedBatch {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
};

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

torch::Tensor AdamW::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const AdamWOptions&>(group.options());
    std::map<std::string, FusedBatch> batches;  // by device and dtype
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "fsdp::optim::AdamW does not support sparse gradients");
      AdamWParamState& state = state_of(*this, p, options.amsgrad());
      state.step(state.step() + 1);
      FusedBatch& batch = batches[p.device().str() + "/" + c10::toString(p.scalar_type())];
      batch.params.push_back(p);
      batch.grads.push_back(p.grad());
      batch.exp_avgs.push_back(state.exp_avg());
      batch.exp_avg_sqs.push_back(state.exp_avg_sq());
      if (options.amsgrad()) batch.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
      batch.steps.push_back(device_step(p, state.step()));
    }
    for (auto& [key, batch] : batches) {
      at::_foreach_add_(batch.steps, 1);  // as PyTorch's fused AdamW: the kernel reads step + 1
      const auto [beta1, beta2] = options.betas();
      at::_fused_adamw_(batch.params, batch.grads, batch.exp_avgs, batch.exp_avg_sqs,
                        batch.max_exp_avg_sqs, batch.steps, options.lr(), beta1, beta2,
                        options.weight_decay(), options.eps(), options.amsgrad(),
                        /*maximize=*/false);
    }
  }
  return loss;
}

}  // namespace fsdp::optim
