#pragma once
// Mixed precision for the unsharded reference run, done the way FSDP does it but without
// sharding: forward and backward run on parameters cast to param_dtype; each backward's gradient
// is rounded to reduce_dtype and added, in fp32, to the master parameters' gradient, which the
// optimizer steps. The sharded run must then match it up to summation order.

#include <fsdp/options.h>

#include <torch/nn/module.h>

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

}  // namespace gpt
