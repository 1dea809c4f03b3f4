#pragma once
// What a unit (ParamGroup) works with, built once by the model (FsdpState) and handed to each of
// its units: where its communication runs, over which process groups, under which rate limiter
// and conductor, and how its gradients are reduced. A unit calls nothing above it: what it has to
// say goes to the conductor below it or through UnitEvents (param_group.h).

#include "core/unit_comm.h"

namespace fsdp {

class DeviceRuntime;
class RateLimiter;
class StepConductor;

struct UnitEnv {
  DeviceRuntime& device;
  Collectives& shard_group;  ///< all-gather and reduce-scatter inside this rank's shard group
  Collectives* replicas;     ///< all-reduce across the replicas of the shard; null: one replica
  RateLimiter& limiter;
  /// The step's order of events: the unit reports its backward reached and its gradient ready.
  StepConductor& conductor;
  ReduceSettings reduce;
  /// The model's shards are published for the pass under way (Collectives::publish_shards):
  /// units borrow their unsharded buffers from the publication (published_unsharded).
  const bool& shards_published;
};

}  // namespace fsdp
