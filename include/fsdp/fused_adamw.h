#pragma once
// AdamW in one fused kernel per (device, dtype) and parameter group: ATen's _fused_adamw_ (the
// kernel behind PyTorch's AdamW(fused=True), CPU and CUDA) instead of LibTorch's loop of a dozen
// element-wise kernels per parameter.
//
// It is a torch::optim::AdamW: the same options, param groups and per-parameter state
// (AdamWParamState: exp_avg, exp_avg_sq, max_exp_avg_sq, step), so everything that takes a
// torch::optim::AdamW (fsdp::save_checkpoint, load_sharded, gather_full_optimizer_state) takes it,
// and a checkpoint saved with one of the two resumes with the other. Only step() differs: the
// update is the same formula (decoupled weight decay, bias-corrected moments) computed in one
// pass over each tensor, so results agree with LibTorch's loop to fp32 rounding, not bitwise.
// The kernel reads each parameter's step count from a one-element float tensor on the
// parameter's device, kept here beside AdamWParamState::step() (which checkpoints store): no
// host-device copy per step.
//
// Example:
//   fsdp::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));

#include <torch/optim/adamw.h>

#include <unordered_map>

namespace fsdp::optim {

class AdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;

  torch::Tensor step(LossClosure closure = nullptr) override;

 private:
  struct DeviceStep {
    int64_t step = -1;  // the count `tensor` holds
    at::Tensor tensor;  // [1] float on the parameter's device
  };
  // The step count of `param` on its device, equal to `count` (refilled when a checkpoint load or
  // another optimizer moved AdamWParamState::step()).
  const at::Tensor& device_step(const at::Tensor& param, int64_t count);

  std::unordered_map<void*, DeviceStep> device_steps_;
};

}  // namespace fsdp::optim
