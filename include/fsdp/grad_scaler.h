#pragma once
/// Loss scaling for fp16 mixed precision across shards. fp16 gradients underflow unless the loss
/// is scaled up, and a scale too large overflows some of them. With sharding an overflow may
/// land in one rank's shard only, so every rank must learn of it and skip the step together,
/// or the ranks' shards would stop describing one model.

#include <fsdp/distributed.h>

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

namespace fsdp {

struct GradScalerOptions {
  TORCH_ARG(double, init_scale) = 65536.0;
  /// The scale is multiplied by this after growth_interval steps in a row without overflow...
  TORCH_ARG(double, growth_factor) = 2.0;
  /// ... and by this after a step with an overflow (which is skipped).
  TORCH_ARG(double, backoff_factor) = 0.5;
  TORCH_ARG(int64_t, growth_interval) = 2000;
};

/// An optimizer whose update divides each gradient by the loss scale itself (PyTorch's
/// `_step_supports_amp_scaling`; fsdp::optim::AdamW, fsdp::optim::SGD): ShardedGradScaler::step()
/// then only reads the gradients for inf/NaN instead of first dividing them in a pass of its own,
/// which reads and writes them.
class StepsScaledGradients {
 public:
  virtual ~StepsScaledGradients() = default;
  /// step() with every gradient divided by `scale` first; the gradients are left divided.
  virtual void step_scaled(double scale) = 0;
};

/// Like torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler.
///
/// Example:
///   fsdp::ShardedGradScaler scaler(*dist->world);
///   scaler.scale(loss).backward();
///   scaler.unscale_(optimizer);                 // optional: before clipping
///   fsdp::clip_grad_norm_(model, 1.0);
///   scaler.step(optimizer);                     // skipped on every rank if any rank overflowed
///   scaler.update();
class ShardedGradScaler {
 public:
  /// `group` must hold every rank that trains the model (the world group).
  explicit ShardedGradScaler(ProcessGroup& group, GradScalerOptions options = {});
  /// A single process (an unsharded model): nobody to agree with.
  explicit ShardedGradScaler(GradScalerOptions options = {});

  /// loss × scale.
  at::Tensor scale(const at::Tensor& loss) const;
  /// Divides the gradients of `optimizer`'s parameters by the scale and agrees with every rank
  /// whether any of them is inf or NaN (a collective: every rank calls it). Once per step.
  void unscale_(torch::optim::Optimizer& optimizer);
  /// Steps unless some rank found inf/NaN in its gradients; returns whether it did. Gradients not
  /// unscaled yet are unscaled first, or, by an optimizer that StepsScaledGradients, in its update.
  bool step(torch::optim::Optimizer& optimizer);
  /// Backs the scale off after a skipped step, grows it after growth_interval good steps.
  void update();

  double get_scale() const { return scale_; }
  /// Whether this step's gradients overflowed on some rank (valid after unscale_ or step).
  bool found_inf() const { return found_inf_; }

 private:
  ProcessGroup* group_;  // null: single process
  GradScalerOptions options_;
  double scale_;
  int64_t good_steps_ = 0;
  // Agrees with every rank whether a gradient is inf/NaN; divides them by the scale if `unscale`.
  void check_gradients(torch::optim::Optimizer& optimizer, bool unscale);

  bool checked_ = false;   // found_inf_ holds this step's answer
  bool unscaled_ = false;  // the gradients are divided by the scale
  bool found_inf_ = false;
};

}  // namespace fsdp
