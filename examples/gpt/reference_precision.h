#pragma once
// Mixed precision for the unsharded reference run, done the way FSDP does it but without
// sharding: forward and backward run on parameters cast to param_dtype; each backward's gradient
// is rounded to reduce_dtype and added, in fp32, to the master parameters' gradient, which the
// optimizer steps. The sharded run must then match it up to summation order.

#include <fsdp/options.h>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <vector>

namespace gpt {

class ReferencePrecision {
 public:
  ReferencePrecision(torch::nn::Module& model, const fsdp::MixedPrecision& policy);

  /// Before a forward: the parameters become param_dtype copies of the masters (no gradient).
  void cast_parameters();
  /// After its backward: the parameters are the masters again, the new gradient added to theirs.
  void restore_masters();

 private:
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> masters_;      // the fp32 data while the parameters are cast
  std::vector<torch::Tensor> master_grads_;  // gradients of earlier micro-batches
  fsdp::MixedPrecision policy_;
};

/// Dynamic loss scaling for the unsharded reference, written apart from the library's
/// fsdp::ShardedGradScaler (so that a bug there cannot show on both sides of a comparison), with
/// torch.amp.GradScaler's rules: gradients divided by the scale; a step with an inf or NaN
/// gradient is skipped and the scale multiplied by `backoff`; after `growth_interval` finite
/// steps in a row it is multiplied by `growth`.
class ReferenceLossScaler {
 public:
  explicit ReferenceLossScaler(double init_scale, double growth = 2.0, double backoff = 0.5,
                               int64_t growth_interval = 2000);

  torch::Tensor scale(const torch::Tensor& loss) const;
  /// Unscales the gradients of the optimizer's parameters (before clipping sees them).
  void unscale_(torch::optim::Optimizer& optimizer);
  /// Steps unless a gradient was not finite, then updates the scale. Returns whether it stepped.
  bool step_update(torch::optim::Optimizer& optimizer);
  /// unscale_, then step_update.
  bool unscale_step_update(torch::optim::Optimizer& optimizer);
  double current_scale() const { return scale_; }

 private:
  double scale_, growth_, backoff_;
  int64_t growth_interval_, finite_steps_ = 0;
  bool finite_ = true;  // the gradients unscale_ saw
};

}  // namespace gpt
