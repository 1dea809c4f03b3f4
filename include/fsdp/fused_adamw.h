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
// host-device copy per step. With fp16's loss scaling (fsdp::ShardedGradScaler) the kernel divides
// the gradients by the scale as it reads them: no separate unscaling pass.
//
// Example:
//   fsdp::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));

#include <fsdp/fully_shard.h>
#include <fsdp/grad_scaler.h>
#include <fsdp/steps_in_backward.h>

#include <torch/optim/adamw.h>

#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fsdp::optim {

class AdamW : public torch::optim::AdamW, public StepsScaledGradients, public StepsInBackward {
 public:
  using torch::optim::AdamW::AdamW;
  ~AdamW() override;

  /// Waits for the steps queued by StepInBackward (rethrowing the first failure), then steps
  /// every parameter with a gradient that none of them stepped.
  torch::Tensor step(LossClosure closure = nullptr) override;
  /// step() with the gradients divided by `scale` in the kernel (ShardedGradScaler::step).
  void step_scaled(double scale) override;

  void step_parameters(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) override;

 private:
  // The tensors of one kernel call: one device, one dtype, one param group's options.
  struct FusedBatch {
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
  };
  void add_to_batches(std::map<std::string, FusedBatch>& batches, const at::Tensor& p,
                      const at::Tensor& grad, bool amsgrad);
  // `scale`: the gradients' loss scale, divided out by the kernel (0: none).
  void run_batches(std::map<std::string, FusedBatch>& batches, const torch::optim::AdamWOptions& options,
                   double scale = 0);
  // Every parameter with a gradient that step_parameters has not stepped.
  void step_remaining(double scale);

  // [Note: step counts shared by count]
  // The kernel reads each parameter's step count from a one-element float tensor on its device.
  // Parameters stepped together share a count, so they share one tensor holding it: one is made
  // per count, device and thread (a thread's steps run on its own CUDA stream), instead of a
  // tensor per parameter advanced by _foreach_add_, whose CPU path dispatches an add per tensor
  // (on a model of 48 small blocks, 576 adds were 55 % of the optimizer's step). The kernel only
  // reads them, and a checkpoint that moves AdamWParamState::step() is simply another count.
  struct StepTensor {
    std::thread::id thread;
    c10::Device device;
    int64_t count;
    at::Tensor tensor;  // [1] float holding `count`
  };
  at::Tensor step_tensor(c10::Device device, int64_t count);
  std::vector<StepTensor> step_tensors_;  // the counts in use, newest last
  std::mutex step_tensors_mutex_;         // step() and the queued steps' thread
};

}  // namespace fsdp::optim
