#pragma once
// How a unit's flat groups are all-gathered and reduce-scattered: objects chosen once per flat
// group when the model is built, which the unit (ParamGroup) calls without knowing which it has
// (as FSDP2's per-group all-gather and reduce-scatter objects):
//  - plain: gather_unit and reduce_unit_gradient (unit_comm.h) on the DeviceRuntime's lanes,
//    over whichever Collectives the device gave the model (rings, shared memory, NCCL, staged);
//  - the board's, where the model's collectives publish ([Note: decoupled collectives] in
//    shm_collectives.cpp): a gather that lends (or copies) the unit's unsharded buffer from the
//    shards published at the step's start ([Note: gathering from the board]), and a reduction
//    posted, its sum completed when the unit waits for it.
// The model's UnitCollectives chooses them and hears the step's model-wide events (the
// conductor's StepListener: [Note: one schedule, two kinds of units]); only the board's variant
// does anything on them.

#include "comm/comm_thread.h"
#include "core/flat_param.h"
#include "core/rate_limiter.h"
#include "core/step_conductor.h"
#include "core/unit_comm.h"

#include <functional>
#include <memory>
#include <string>

namespace fsdp {

class DeviceRuntime;

/// How one flat group is all-gathered.
class UnitGather {
 public:
  virtual ~UnitGather() = default;
  /// Fills `flat`'s unsharded buffer with every rank's shard (allocating it, or pointing it at
  /// bytes gathered already); wait on the handle (empty: filled already) before using it.
  /// `label`: the unit's name in traces, kept alive by the unit.
  virtual CommHandle issue(FlatParam& flat, const std::string& label) = 0;
};

/// How one flat group's gradient is reduced.
class UnitReduce {
 public:
  virtual ~UnitReduce() = default;
  /// Reduces `flat`'s unsharded gradient into its gradient shard as `plan` says, and frees the
  /// unsharded gradient; wait() (or wait_host()) on the handle, and the shard holds the result.
  /// `end` is dropped with the reduction's task, whether it ran or not.
  virtual CommHandle issue(FlatParam& flat, const ReducePlan& plan, std::shared_ptr<ReductionEnd> end,
                           const std::string& label) = 0;
};

/// The collectives of a model's units: chooses each flat group's gather and reduction, and hears
/// the step's events (every rank's in the same order).
class UnitCollectives : public StepListener {
 public:

  /// The gather of `flat`, one of a unit's flat groups, which outlives it. `pass_only`: whether
  /// only a forward or backward pass sees the unit's unsharded parameters (it reshards after
  /// forward and is not the root), asked at each step's start. `give_back`: reshards the flat
  /// group unless its backward is under way, when bytes lent to it are to change.
  virtual std::shared_ptr<UnitGather> gather(FlatParam& flat, std::function<bool()> pass_only,
                                             std::function<void()> give_back) = 0;
  /// The reduction of `flat`'s gradient.
  virtual std::shared_ptr<UnitReduce> reduce(const FlatParam& flat) = 0;
};

/// The board's variants where `shard_group` publishes (shared memory) and the shards are on the
/// host; the plain ones elsewhere. `replicas`: all-reduce across the shard's replicas (null: one).
std::unique_ptr<UnitCollectives> make_unit_collectives(DeviceRuntime& device, Collectives& shard_group,
                                                       Collectives* replicas);

}  // namespace fsdp
