#pragma once
/// Gradient clipping across shards: the global norm needs every rank's piece of the gradient.

#include <fsdp/fully_shard.h>

namespace fsdp {

/// torch::nn::utils::clip_grad_norm_ for a list of parameters that may be shards: LibTorch's own
/// (and a norm written by hand over model->parameters()) sees only this rank's pieces and clips
/// each rank by its own norm, silently. This one finds the sharded model each parameter belongs
/// to and sums the squares of its pieces over the model's shard group; parameters of no sharded
/// model count whole, as LibTorch counts them. Returns the norm before clipping. A collective when
/// any parameter is sharded: every rank calls it with the same list (`model->parameters()`, a
/// param group's params, a submodule's parameters). L2 only (norm_type 2).
///
/// Example (a port replaces LibTorch's call by this one, with the same arguments):
///   loss.backward();
///   fsdp::clip_grad_norm_(model->parameters(), 0.5);   // was torch::nn::utils::clip_grad_norm_
///   optimizer.step();
double clip_grad_norm_(const std::vector<torch::Tensor>& parameters, double max_norm, double norm_type = 2.0);

/// Scales the sharded gradients so that their global L2 norm is at most `max_norm`, like
/// torch::nn::utils::clip_grad_norm_ on the unsharded model, and returns the norm before
/// clipping. A collective (sum of squares over the shard group): every rank calls it, after
/// backward and before the optimizer step.
///
/// Example:
///   loss.backward();
///   double norm = fsdp::clip_grad_norm_(model, 1.0);
///   optimizer.step();
double clip_grad_norm_(const ShardedModel& model, double max_norm);

}  // namespace fsdp
