#pragma once
// The communication work of one unit, the same on every device (as FSDP2's foreach_all_gather
// and foreach_reduce): what is copied where, in which dtype, divided by what. ParamGroup decides
// when; the DeviceRuntime (device.h) decides where it runs.

#include "comm/collectives.h"
#include "core/flat_param.h"

#include <c10/core/ScalarType.h>

#include <optional>
#include <utility>

namespace fsdp {

/// How the gradients of every unit are reduced: the mean over the world's W ranks.
struct ReduceSettings {
  std::optional<c10::ScalarType> reduce_dtype;  ///< mixed precision's; unset: the gradient's own
  int world_size = 1;

  /// The dtype a gradient computed in `grad_dtype` is reduced in.
  c10::ScalarType dtype_for(c10::ScalarType grad_dtype) const {
    return reduce_dtype.value_or(grad_dtype);
  }
  /// (pre, post): gradients reduced in `dtype` are divided by `pre` before the sum and by `post`
  /// after; pre * post = W.
  std::pair<double, double> divide_factors(c10::ScalarType dtype) const;
};

/// How a unit's unsharded gradient becomes its gradient shard.
struct ReducePlan {
  c10::ScalarType dtype;  ///< the reductions' dtype (mixed precision's reduce_dtype)
  double pre = 1.0;       ///< divide before the sum ...
  double post = 1.0;      ///< ... and after it: pre * post = W (paper, section 4.3)
  bool accumulate = false;  ///< add to the gradient shard the optimizer kept, else overwrite it
};

/// The plan for a gradient computed in `grad_dtype`: reduced in reduce_dtype, unless the unit
/// keeps `full_precision` ([Note: full-precision modules]); adding to the shard if `accumulate`.
ReducePlan plan_reduction(const ReduceSettings& settings, c10::ScalarType grad_dtype,
                          bool full_precision, bool accumulate);

/// flat.full() <- every rank's shard, cast to the compute dtype on the way in (mixed precision
/// then all-gathers compute-dtype bytes).
void gather_unit(FlatParam& flat, Collectives& shard_group);

/// Whether a unit's unsharded buffer is its shards as they are, side by side on the host, in one
/// dtype: all_gather then puts this rank's shard in place itself, and a copy of every rank's
/// shard laid out side by side is an all-gather already (unit_collectives.h).
bool unsharded_is_host_shards(const FlatParam& flat);

/// Whether `flat`'s gradient, reduced as `plan` says, is summed straight into its gradient shard
/// (rules::reduces_into_shard): nothing but the division by plan.post follows the sum then.
bool reduces_into_shard(FlatParam& flat, const ReducePlan& plan);

/// `flat`'s unsharded gradient as the reduce-scatter takes it: in the plan's dtype, divided by
/// plan.pre.
at::Tensor gradient_to_scatter(FlatParam& flat, const ReducePlan& plan);

/// flat.grad_shard() <- (+=) the mean over the world of the unsharded gradients: reduce-scattered
/// inside the shard group, then all-reduced across the replicas (hybrid, no-shard).
void reduce_unit_gradient(FlatParam& flat, const ReducePlan& plan, Collectives& shard_group,
                          Collectives* replicas);

}  // namespace fsdp
