#pragma once
// [Note: one schedule, two kinds of units]
// The order of a step's events, written once: which unit is gathered when (forward order,
// forward and backward prefetch), when a unit reshards after its forward, what happens when a
// unit's backward is reached and its gradient is ready, and how the backward ends (every unit
// finished, in reverse). It holds no tensor. The engine's units (ParamGroup) run it as autograd
// drives them; the planner (src/plan/planned_step.cpp) runs the same conductor over planned units
// that count bytes instead of moving them, so what it predicts a step holds and sends is the
// engine's order by construction. The order inside one unit (its limiter waits, which buffer is
// alive when) is written once too, in core/unit_order.h, which both kinds of units run ([Note: one
// order inside a unit]). A unit calls down into the conductor (backward_reached, gradient_ready);
// the conductor calls the unit through ScheduledUnit and tells the model's other parts (the
// collectives' shared board, autograd's end-of-backward callback) through StepListener.

#include <fsdp/options.h>

#include <string>
#include <vector>

namespace fsdp {

/// What the conductor asks of a unit (an engine unit, or a planned one).
class ScheduledUnit {
 public:
  virtual ~ScheduledUnit() = default;
  virtual bool is_root() const = 0;
  virtual const std::string& name() const = 0;
  /// Its forward starts: issue its all-gathers (a unit kept gathered from an earlier forward
  /// whose backward never came gathers again).
  virtual void begin_forward() = 0;
  /// Issues the all-gathers if the unit is sharded; a prefetch passes `optional` (the rate
  /// limiter may refuse it). False if refused.
  virtual bool issue_unshard(bool optional) = 0;
  /// The parameters are usable once this returns.
  virtual void wait_unshard() = 0;
  /// Its forward ended: reshard, or keep the gathered buffer for the backward.
  virtual void end_forward(bool reshard) = 0;
  /// Its backward starts (the unit is unsharded): take gradients, reduced unless `no_sync`.
  virtual void begin_backward(bool no_sync) = 0;
  /// Whether its backward has started in the current backward pass.
  virtual bool backward_ran() const = 0;
  /// The backward ended: reduce what is left, wait for the reductions, reshard.
  virtual void finish_backward() = 0;
};

/// The step's events that concern the whole model rather than one unit.
class StepListener {
 public:
  virtual ~StepListener() = default;
  /// The root's forward starts: a new step.
  virtual void step_begins() {}
  /// The root's forward ended.
  virtual void forward_ends() {}
  /// The root's backward was reached: the end of this backward must come (finish_backward).
  virtual void backward_begins() {}
  /// Every unit finished its backward.
  virtual void backward_ends() {}
  /// Between steps, something is about to read or write the shards (a state dict, a checkpoint,
  /// summoning the full parameters, a parameter rebound from outside).
  virtual void shards_may_change() {}
};

class StepConductor {
 public:
  StepConductor(const FullyShardOptions& options, StepListener& listener);

  /// A unit's forward starts: records the forward order (the root starts a step), unshards the
  /// unit and prefetches the one that followed it last iteration.
  void pre_forward(ScheduledUnit& unit);
  /// A unit's forward ended. It reshards unless a backward will come (`will_backward`) and it
  /// keeps its parameters for it (the root; SHARD_GRAD_OP's units), in training mode
  /// ([Note: an evaluation forward reshards]).
  void post_forward(ScheduledUnit& unit, bool training, bool will_backward);
  /// The first gradient reached `unit`'s outputs: unshard it, prefetch the next one (BACKWARD_PRE),
  /// begin its backward.
  void backward_reached(ScheduledUnit& unit);
  /// `unit`'s unsharded gradient is complete: prefetch the next one (BACKWARD_POST).
  void gradient_ready(ScheduledUnit& unit);
  /// The backward ended: every unit of `units` (the root first) finishes, in reverse.
  void finish_backward(const std::vector<ScheduledUnit*>& units);

  /// A unit's shards are about to be read or written between steps.
  void shards_may_change() { listener_.shards_may_change(); }

  void set_no_sync(bool no_sync) { no_sync_ = no_sync; }
  /// [Note: units held unsharded] While set, no unit reshards: not after its forward, not after
  /// its backward (a pipeline stage keeps its parameters for all its micro-batches).
  void set_hold_unsharded(bool hold) { hold_unsharded_ = hold; }
  bool holds_unsharded() const { return hold_unsharded_; }
  /// Between the root's pre_forward and post_forward.
  bool root_forward_running() const { return root_forward_running_; }
  /// The units other than the root that started a forward in this step, in order.
  const std::vector<ScheduledUnit*>& forward_order() const { return forward_order_; }

 private:
  void record_forward_order(ScheduledUnit& unit);
  void prefetch_forward_after(ScheduledUnit& unit);
  void prefetch_backward_after(ScheduledUnit& unit);

  const FullyShardOptions& options_;
  StepListener& listener_;
  std::vector<ScheduledUnit*> forward_order_;           // this iteration, units without the root
  std::vector<ScheduledUnit*> previous_forward_order_;  // the last iteration's
  bool root_forward_running_ = false;
  bool no_sync_ = false;  // inside a NoSyncGuard: keep unsharded gradients, reduce nothing
  bool hold_unsharded_ = false;  // [Note: units held unsharded]
};

}  // namespace fsdp
