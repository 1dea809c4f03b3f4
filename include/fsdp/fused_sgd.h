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
// it reads them. It steps during backward too (fsdp::optim::StepInBackward).
//
// Example:
//   fsdp::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));

#include <fsdp/grad_scaler.h>
#include <fsdp/steps_in_backward.h>

#include <torch/optim/sgd.h>

#include <map>
#include <string>
#include <vector>

namespace fsdp::optim {

class SGD : public torch::optim::SGD, public StepsScaledGradients, public StepsInBackward {
 public:
  using torch::optim::SGD::SGD;
  ~SGD() override;

  /// Waits for the steps queued by StepInBackward (rethrowing the first failure), then steps
  /// every parameter with a gradient that none of them stepped.
  torch::Tensor step(LossClosure closure = nullptr) override;
  /// step() with the gradients divided by `scale` in the kernel (ShardedGradScaler::step).
  void step_scaled(double scale) override;
  void step_parameters(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) override;

 private:
  // The tensors of one kernel call: one device, one dtype, one param group's options, and either
  // every momentum buffer new (the kernel copies the gradient into it) or none.
  struct FusedBatch {
    std::vector<at::Tensor> params, grads, momentum_buffers;
    bool first_step = false;
  };
  // Every parameter with a gradient that step_parameters has not stepped; `scale`: the
  // gradients' loss scale, divided out by the kernel (0: none).
  void step_remaining(double scale);
  void add_to_batches(std::map<std::string, FusedBatch>& batches, const at::Tensor& p,
                      const at::Tensor& grad, double momentum);
  void run_batches(std::map<std::string, FusedBatch>& batches, const torch::optim::SGDOptions& options,
                   double scale);
};

}  // namespace fsdp::optim
