#pragma once
// [Note: the planned step]
// One training step of one micro-batch on one rank, run by the engine's own StepConductor
// ([Note: one schedule, two kinds of units]) over planned units: a PlannedUnit does what a
// ParamGroup does when the conductor calls it, in the same order inside the unit (core/unit_order.h,
// with the rate limiter's own counts: [Note: one order inside a unit]), on counts instead of
// tensors (the unsharded parameters it holds, its unsharded gradient, its gradient shard, the
// collectives it issues). What the conductor cannot know, autograd's part (the activations each
// piece saves and frees, and the order in which backward reaches the units: the reverse of
// forward), is played here. The step runs twice: the first iteration records the forward order
// that forward prefetch follows, as in the engine; the second is the one measured.

#include "plan/plan_layout.h"
#include "plan/plan_traffic.h"

#include <string>
#include <vector>

namespace fsdp::planning {

// The running memory of one rank and its highest point so far.
class Timeline {
 public:
  Timeline(MemoryBreakdown start, std::string suffix);

  MemoryBreakdown& now() { return now_; }
  /// A moment that may be the peak: `transient` more workspace than now.
  void check(int64_t transient, const std::string& when);
  const MemoryBreakdown& peak() const { return peak_; }
  const std::string& peak_at() const { return peak_at_; }

 private:
  MemoryBreakdown now_, peak_;
  std::string peak_at_, suffix_;
};

// [Note: micro-batches in the plan] Gradient accumulation changes what a backward holds, so the
// memory plan runs each kind of micro-batch a step has and keeps the highest peak:
// - synchronised (the default): the first is a step of its own; from the second on, every
//   gradient shard the first allocated is alive from the start, and each reduction lands in a
//   temporary that is added to the shard, so even at W = 1 gradients no longer go straight into
//   the shard (rules::grads_into_shard with a sum to add to).
// - no_sync: the micro-batches before the last reduce nothing and keep each unit's unsharded
//   gradient; from the second on, every one of them is alive from the start; the last reduces
//   them all (into shards zero_grad freed).
struct MicroBatch {
  int64_t index = 1;             // 1-based, for the peak's label
  bool shards_hold_sum = false;  // gradient shards alive from an earlier backward
  bool full_grads_kept = false;  // no_sync kept every unit's unsharded gradient
  bool reduces = true;           // false under no_sync before the last micro-batch
  bool last = true;              // the optimizer step follows
  // The gradients cannot go straight into the shard: there is a sum to add to, or to keep.
  bool accumulating() const { return shards_hold_sum || full_grads_kept || !reduces; }
};

/// A unit's communication as one piece of work on the communication lane: its all-gathers (in
/// forward or backward) or its reductions, whatever their collectives (none at F = 1, where an
/// offloaded unit still copies its shard).
struct PlannedTransfer {
  enum Kind { ForwardGather, BackwardGather, Reduction } kind;
  size_t unit = 0;                  ///< index in RankLayout::units
  std::vector<size_t> collectives;  ///< indexes into PlannedStep::collectives
};

/// What the step did, in order: the step-time model replays it (plan_time.cpp).
struct PlannedEvent {
  enum Kind {
    Forward,   ///< `unit`'s forward computes
    Backward,  ///< `unit`'s backward computes
    Issue,     ///< `transfer` is issued
    Wait,      ///< compute waits for `transfer`
  } kind;
  size_t index = 0;  ///< the unit (Forward, Backward) or the transfer (Issue, Wait)
};

/// Runs one step of `micro` from the memory `start`: the timeline of the measured iteration, the
/// collectives it issued (in issue order), and its events.
struct PlannedStep {
  Timeline timeline;
  std::vector<PlannedCollective> collectives;
  std::vector<PlannedTransfer> transfers;
  std::vector<PlannedEvent> events;
};
PlannedStep run_planned_step(const PlanSetup& setup, const RankLayout& layout, const MicroBatch& micro,
                             const MemoryBreakdown& start, const std::string& suffix);

}  // namespace fsdp::planning
