#pragma once
// gpt_train --optimizer muon steps one model with two optimizers: fsdp::optim::Muon for the
// blocks' matrices and the fused AdamW for the rest. What a step does with "the optimizer"
// (zero_grad, fp16's gradient scaler, the reference's loss scaler) then has to see both at once:
// fsdp::ShardedGradScaler checks and unscales one optimizer's gradients once per step, and must
// skip both or neither. MuonAndAdamW is that one optimizer: a torch::optim::Optimizer whose param
// groups are both optimizers' (the same tensors, copies of their options) and whose step() steps
// both. (Stepping units during backward takes the two themselves: StepInBackward's list.)

#include <fsdp/fused_adamw.h>
#include <fsdp/muon.h>

#include <torch/optim/optimizer.h>

#include <vector>

namespace gpt {

/// Muon and AdamW as one optimizer: step() steps AdamW, then Muon (each waits for what it
/// stepped during backward, and skips it). Its param groups list both
/// optimizers' parameters for whoever reads their gradients (zero_grad, gradient scalers); their
/// options are copies: set learning rates, and read or save state, on the two optimizers.
///
/// Example:
///   gpt::MuonAndAdamW both(muon, adamw);
///   scaler.unscale_(both);          // every gradient, one agreement on overflow
///   scaler.step(both);              // both step, or neither
class MuonAndAdamW : public torch::optim::Optimizer {
 public:
  /// Both must outlive this.
  MuonAndAdamW(fsdp::optim::Muon& muon, fsdp::optim::AdamW& adamw);

  torch::Tensor step(LossClosure closure = nullptr) override;

 private:
  fsdp::optim::Muon& muon_;
  fsdp::optim::AdamW& adamw_;
};

}  // namespace gpt
