#pragma once
// gpt_train --optimizer muon steps one model with two optimizers: fsdp::optim::Muon for the
// blocks' matrices and the fused AdamW for the rest. What a step does with "the optimizer"
// (zero_grad, fp16's gradient scaler, the reference's loss scaler, stepping units during
// backward) then has to see both at once: the scaler agrees once per step whether any gradient
// overflowed and skips both or neither, and StepInBackward hooks one optimizer per model.
// MuonAndAdamW is that one optimizer: a torch::optim::Optimizer whose param groups are both
// optimizers' (the same tensors, copies of their options) and whose step() steps both.

#include <fsdp/fused_adamw.h>
#include <fsdp/muon.h>
#include <fsdp/steps_in_backward.h>

#include <torch/optim/optimizer.h>

#include <vector>

namespace gpt {

/// Muon and AdamW as one optimizer: step() waits for the units stepped during backward, then
/// steps AdamW and Muon (each skips what it stepped then). Its param groups list both
/// optimizers' parameters for whoever reads their gradients (zero_grad, gradient scalers); their
/// options are copies: set learning rates, and read or save state, on the two optimizers.
///
/// Example:
///   gpt::MuonAndAdamW both(muon, adamw);
///   scaler.unscale_(both);          // every gradient, one agreement on overflow
///   scaler.step(both);              // both step, or neither
class MuonAndAdamW : public torch::optim::Optimizer, public fsdp::optim::StepsInBackward {
 public:
  /// Both must outlive this.
  MuonAndAdamW(fsdp::optim::Muon& muon, fsdp::optim::AdamW& adamw);
  ~MuonAndAdamW() override;

  torch::Tensor step(LossClosure closure = nullptr) override;
  /// A unit's parameters, stepped during backward: each optimizer steps those of its own.
  void step_parameters(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) override;

 private:
  fsdp::optim::Muon& muon_;
  fsdp::optim::AdamW& adamw_;
};

}  // namespace gpt
