#pragma once
// SGD in one fused kernel per (device, dtype) and parameter group: ATen's _fused_sgd_ (the kernel
// behind PyTorch's SGD(fused=True), CPU and CUDA) instead of LibTorch's loop of element-wise
// kernels per parameter.
//
// It is a torch::optim::SGD: the same options (momentum, dampening, weight decay, Nesterov),
// param groups and per-parameter state (SGDParamState::momentum_buffer), so a checkpoint saved
// with one resumes with the other. The update is LibTorch's formula (the first step's momentum
// buffer is the gradient itself, undampened); results agree with its loop to fp32 rounding. With
// fp16's loss scaling (fsdp::ShardedGradScaler) the kernel divides the gradients by the scale as
// it reads them.
//
// Example:
//   fsdp::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));

#include <fsdp/grad_scaler.h>

#include <torch/optim/sgd.h>

#include <map>
#include <string>
#include <vector>

namespace fsdp::optim {

class SGD : public torch::optim::SGD, public StepsScaledGradients {
 public:
  using torch::optim::SGD::SGD;

  torch::Tensor step(LossClosure closure = nullptr) override;
  /// step() with the gradients divided by `scale` in the kernel (ShardedGradScaler::step).
  void step_scaled(double scale) override;

 private:
  // The tensors of one kernel call: one device, one dtype, one param group's options, and either
  // every momentum buffer new (the kernel copies the gradient into it) or none.
  struct FusedBatch {
    std::vector<at::Tensor> params, grads, momentum_buffers;
    bool first_step = false;
  };
  // `scale`: the gradients' loss scale, divided out by the kernel (0: none).
  void step_all(double scale);
  void add_to_batches(std::map<std::string, FusedBatch>& batches, const at::Tensor& p, double momentum);
};

}  // namespace fsdp::optim
