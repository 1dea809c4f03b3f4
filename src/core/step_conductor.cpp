#include "core/step_conductor.h"

#include "core/unit_rules.h"

namespace fsdp {

StepConductor::StepConductor(const FullyShardOptions& options, StepListener& listener)
    : options_(options), listener_(listener) {}

void StepConductor::pre_forward(ScheduledUnit& unit) {
  if (unit.is_root()) {
    listener_.step_begins();
    root_forward_running_ = true;
  }
  record_forward_order(unit);
  unit.begin_forward();
  prefetch_forward_after(unit);
  unit.wait_unshard();
}

// [Note: an evaluation forward reshards]
// In training mode the root's parameters are needed again at once by backward (its output is the
// loss), and SHARD_GRAD_OP (or reshard_after_forward(false)) keeps a unit's until its backward. A
// forward in evaluation mode (module->eval()) reshards every unit as it ends, even under grad
// mode: public programs evaluate without a NoGradGuard, and a unit kept unsharded for a backward
// that never comes leaves its parameters as views of the gathered buffer next to gradients that
// are views of the shard, so the optimizer's next step meets two shapes. A backward that does
// follow an evaluation (a saliency map) gathers the unit again in its pre-backward.
void StepConductor::post_forward(ScheduledUnit& unit, bool training, bool will_backward) {
  const bool keeps_for_backward = unit.is_root() || !options_.unit_reshards_after_forward(unit.name());
  unit.end_forward(/*reshard=*/!will_backward || !training || !keeps_for_backward);
  if (unit.is_root()) {
    root_forward_running_ = false;
    listener_.forward_ends();
  }
}

void StepConductor::backward_reached(ScheduledUnit& unit) {
  if (unit.is_root()) listener_.backward_begins();
  unit.issue_unshard(/*optional=*/false);
  if (options_.backward_prefetch() == BackwardPrefetch::BackwardPre) prefetch_backward_after(unit);
  unit.begin_backward(no_sync_);
}

void StepConductor::gradient_ready(ScheduledUnit& unit) {
  if (options_.backward_prefetch() == BackwardPrefetch::BackwardPost) prefetch_backward_after(unit);
}

void StepConductor::finish_backward(const std::vector<ScheduledUnit*>& units) {
  // Reverse forward order issues any late reduce-scatters in the order backward would have.
  for (auto it = units.rbegin(); it != units.rend(); ++it) (*it)->finish_backward();
  listener_.backward_ends();
}

void StepConductor::record_forward_order(ScheduledUnit& unit) {
  if (unit.is_root()) {
    if (!forward_order_.empty()) previous_forward_order_ = forward_order_;
    forward_order_.clear();
    return;
  }
  forward_order_.push_back(&unit);
}

void StepConductor::prefetch_forward_after(ScheduledUnit& unit) {
  if (!options_.forward_prefetch()) return;
  ScheduledUnit* next = rules::forward_prefetch_target(previous_forward_order_, &unit, unit.is_root());
  if (next) next->issue_unshard(/*optional=*/true);
}

void StepConductor::prefetch_backward_after(ScheduledUnit& unit) {
  if (options_.backward_prefetch() == BackwardPrefetch::None) return;
  ScheduledUnit* next = rules::backward_prefetch_target(forward_order_, &unit, unit.is_root());
  // BACKWARD_POST: the root's gradients may complete last (an embedding used first in forward),
  // when the unit "after" it is long done: gathering it again would be wasted.
  if (next && !next->backward_ran()) next->issue_unshard(/*optional=*/true);
}

}  // namespace fsdp
