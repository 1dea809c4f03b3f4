#pragma once
// The mixed-precision side of a training step. fp16 needs loss scaling: the sharded run uses the
// library's fsdp::ShardedGradScaler, the reference its own code (torch.amp's rule written again,
// ReferenceLossScaler), so that a bug in the library's scaler cannot show on both sides. The
// reference under a mixed-precision policy also casts its own parameters (ReferencePrecision);
// the sharded run's FSDP units do that themselves.

#include "gpt.h"
#include "reference_precision.h"
#include "train_options.h"

#include <fsdp/distributed.h>
#include <fsdp/grad_scaler.h>

#include <torch/optim/optimizer.h>

#include <memory>

namespace gpt {

class StepPrecision {
 public:
  /// What `o`'s policy needs for the sharded run (`dist` set) or the reference of `model`.
  StepPrecision(const TrainOptions& o, fsdp::Distributed* dist, GPT& model);

  /// Around each micro-batch's forward and backward (the reference's casts; else nothing).
  void before_forward();
  void after_backward();
  /// The loss to call backward on: scaled when fp16 scales it.
  torch::Tensor scale(const torch::Tensor& loss) const;
  /// Divides the gradients by the scale (before clipping sees them).
  void unscale(torch::optim::Optimizer& optimizer);
  /// Steps the optimizer unless a scaled gradient overflowed, and updates the scale. Gradients
  /// not unscaled yet are divided by the scale first, or by the optimizer's own kernel
  /// (fsdp::StepsScaledGradients). Returns whether it stepped.
  bool step(torch::optim::Optimizer& optimizer);
  /// The current loss scale (0: no loss scaling).
  double loss_scale() const;

 private:
  std::unique_ptr<fsdp::ShardedGradScaler> scaler_;          // fp16, sharded run
  std::unique_ptr<ReferenceLossScaler> reference_scaler_;    // fp16, reference run
  std::unique_ptr<ReferencePrecision> reference_precision_;  // reference with a policy
  bool unscaled_ = false;                                    // unscale() ran this step
};

}  // namespace gpt
