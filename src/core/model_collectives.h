#pragma once
// The collectives that run between steps (clipping, state dicts, checkpoints), through the
// model's DeviceRuntime like a unit's own: submitted on a lane and waited for. They are then ordered with
// the units' collectives on every rank ([Note: collective order]); on a GPU they run on the lane's
// stream after the compute work issued so far, and the compute stream waits for them.

#include "core/fsdp_state.h"

#include <ATen/core/Tensor.h>

#include <functional>

namespace fsdp::detail {

/// Runs `collective` (calls of the model's Collectives) on `lane` of the model's DeviceRuntime and
/// returns once the caller may use its results; rethrows its error.
void run_on_device(FsdpState& state, CommLane lane, const std::function<void()>& collective);

/// t <- the sum of t over the shard group (on the collectives' device).
void all_reduce_over_shard_group(FsdpState& state, const at::Tensor& t);

/// The shards of the shard group gathered into a new buffer laid out like `flat`'s unsharded
/// buffer: `shard` (this rank's, laid out like flat.shard(), on the collectives' device) and the
/// other ranks' equivalents.
at::Tensor gather_flat(FsdpState& state, const FlatParam& flat, const at::Tensor& shard);

}  // namespace fsdp::detail
