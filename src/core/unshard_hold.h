#pragma once
// A sharded model held unsharded across several forwards and backwards, for the layers above
// (a pipeline stage's micro-batches): gathered once, its gradients summed unsharded and reduced
// once, resharded when told ([Note: units held unsharded] in core/unshard_hold.cpp).

#include <fsdp/sharded_model.h>

namespace fsdp::detail {

/// Gathers every unit of `model` (those sharded) and keeps them unsharded, with no_sync on (each
/// backward adds into the kept unsharded gradient), until release_unsharded. Every rank of the
/// model's group calls it at the same point.
void hold_unsharded(const ShardedModel& model);
/// Reduces the gradients the backwards kept (reduce-scatter, all-reduce across replicas) into
/// the gradient shards, once; a collective.
void reduce_held_gradients(const ShardedModel& model);
/// Reshards every unit and ends the hold; gradients not reduced yet stay kept for the next hold.
void release_unsharded(const ShardedModel& model);

}  // namespace fsdp::detail
