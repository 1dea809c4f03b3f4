#pragma once
/// Gradient clipping across shards: the global norm needs every rank's piece of the gradient.

#include <fsdp/fully_shard.h>

namespace fsdp {

namespace detail {
double clip_grad_norm(FsdpState& state, double max_norm);
}

/// Scales the sharded gradients so that their global L2 norm is at most `max_norm`, like
/// torch::nn::utils::clip_grad_norm_ on the unsharded model, and returns the norm before
/// clipping. A collective (sum of squares over the shard group): every rank calls it, after
/// backward and before the optimizer step.
///
/// Example:
///   loss.backward();
///   double norm = fsdp::clip_grad_norm_(model, 1.0);
///   optimizer.step();
template <class M>
double clip_grad_norm_(Unit<M>& root, double max_norm) {
  TORCH_CHECK(root.slot().owned_model, "clip_grad_norm_: the model is not sharded (call fully_shard)");
  return detail::clip_grad_norm(*root.slot().owned_model, max_norm);
}

}  // namespace fsdp
