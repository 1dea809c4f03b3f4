#pragma once
// [Note: one order inside a unit]
// The order of one unit's own events, written once and tensor-free, as the step's order between
// units is written once in the conductor ([Note: one schedule, two kinds of units]):
// - unshard: a rate-limiter slot first (a unit counted by the limiter, needing an unsharded
//   buffer, holding none yet: a prefetch may be refused, and the slot waits for the reductions
//   in flight), then the all-gathers, which allocate the unsharded parameters;
// - its parameters all freed again: the slot goes back;
// - backward begins: the gathers waited for, then the limiter (before an unsharded gradient it
//   counts), then the unsharded gradient allocated;
// - a flat group's gradient is complete: the conductor hears of the main group's (a
//   BACKWARD_POST prefetch, while this unit's parameters are still held), then the group's
//   parameters are freed, then its gradient leaves: reduced, straight in the shard already, or
//   kept by no_sync. The main group's reduction counts as in flight for the limiter from its
//   issue until it ends: the engine's communication thread ends it (ReductionEnd), the planner
//   when compute waits for it.
// The engine's ParamGroup runs it over tensors, with the model's RateLimiter (its waits block
// the caller's thread); the planner's PlannedUnit (src/plan/planned_step.cpp) over byte counts,
// with a limiter that counts the same (core/limiter_count.h) and turns a wait into compute waiting
// for the oldest reduction. So what the planner predicts a unit holds when, and where the step
// waits for the limiter, is the engine's by construction.

#include <cstddef>

namespace fsdp {

class ScheduledUnit;
class StepConductor;

/// The rate limiter as a unit meets it (LimiterCount's rules): the engine's blocks, the
/// planner's counts.
class UnitLimiter {
 public:
  virtual ~UnitLimiter() = default;
  /// Before a unit unshards: false for a prefetch (`optional`) refused at the limit; else once
  /// the reductions in flight allow, the unit holds a slot.
  virtual bool acquire(bool optional) = 0;
  /// The unit freed its unsharded parameters: the slot back.
  virtual void release() = 0;
  /// Before a unit allocates its unsharded gradient: until the reductions in flight allow.
  virtual void wait_for_reductions() = 0;
};

/// What a unit does at the moments of its order: the engine with tensors, the planner with
/// counts. `flat` is the index of one of its flat groups (0: the main one).
class UnitMoments {
 public:
  virtual ~UnitMoments() = default;
  /// Issues the all-gathers of its sharded flat groups (their unsharded buffers allocated).
  virtual void issue_gathers() = 0;
  /// Waits for them: the parameters are usable.
  virtual void wait_gathers() = 0;
  /// Allocates (or keeps, under no_sync) each flat group's unsharded gradient.
  virtual void allocate_gradients() = 0;
  /// Frees `flat`'s unsharded parameters.
  virtual void free_params(size_t flat) = 0;
  /// `flat`'s complete gradient leaves the unit (reduced, in the shard already, or kept);
  /// `counted`: its reduction counts as in flight for the limiter until it ends.
  virtual void settle_gradient(size_t flat, bool counted) = 0;
};

/// Where a flat group's gradient goes in this backward.
struct GradientPath {
  bool trainable = true;
  bool into_shard = false;  ///< written straight into the gradient shard: no unsharded gradient, no reduction
  bool kept = false;        ///< no_sync kept an unsharded gradient from an earlier backward: added to
  bool no_sync = false;     ///< this backward keeps its unsharded gradient instead of reducing it

  /// Backward allocates an unsharded gradient for it (the limiter bounds them).
  bool allocates() const { return trainable && !into_shard && !kept; }
  /// Its gradient leaves through a reduction.
  bool reduced() const { return trainable && !into_shard && !no_sync; }
};

class UnitOrder {
 public:
  /// `unit`'s order, its moments done by `moments`; `conductor` hears of its gradient.
  UnitOrder(ScheduledUnit& unit, StepConductor& conductor, UnitLimiter& limiter, UnitMoments& moments);
  UnitOrder(const UnitOrder&) = delete;
  UnitOrder& operator=(const UnitOrder&) = delete;

  /// Unshards the unit (some flat group is sharded): a slot if it needs one (`needs_slot`: an
  /// unsharded buffer apart from its shards), then the gathers. False: a prefetch refused.
  bool unshard(bool optional, bool needs_slot);
  /// Every flat group is sharded again: the slot back.
  void resharded();
  /// Its backward begins; `main`: where its main flat group's gradient goes.
  void begin_backward(const GradientPath& main);
  /// Flat group `flat`'s gradients are complete (`main`: the unit's main group).
  void gradient_complete(size_t flat, bool main, const GradientPath& path);

  bool holds_slot() const { return holds_slot_; }

 private:
  /// Counted by the limiter (slots and reductions): every unit but the root, whose parameters
  /// stay gathered from the first forward to the end of backward anyway.
  bool rate_limited() const;

  ScheduledUnit& unit_;
  StepConductor& conductor_;
  UnitLimiter& limiter_;
  UnitMoments& moments_;
  bool holds_slot_ = false;
};

}  // namespace fsdp
