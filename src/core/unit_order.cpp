#include "core/unit_order.h"

#include "core/step_conductor.h"

namespace fsdp {

UnitOrder::UnitOrder(ScheduledUnit& unit, StepConductor& conductor, UnitLimiter& limiter, UnitMoments& moments)
    : unit_(unit), conductor_(conductor), limiter_(limiter), moments_(moments) {}

bool UnitOrder::rate_limited() const { return !unit_.is_root(); }

bool UnitOrder::unshard(bool optional, bool needs_slot) {
  if (rate_limited() && needs_slot && !holds_slot_) {
    if (!limiter_.acquire(optional)) return false;
    holds_slot_ = true;
  }
  moments_.issue_gathers();
  return true;
}

void UnitOrder::resharded() {
  if (!holds_slot_) return;
  holds_slot_ = false;  // [Note: rate limiter slots]
  limiter_.release();
}

// The limiter bounds the unsharded gradients a unit allocates: one per unit, its main group's.
void UnitOrder::begin_backward(const GradientPath& main) {
  moments_.wait_gathers();
  if (rate_limited() && main.allocates()) limiter_.wait_for_reductions();
  moments_.allocate_gradients();
}

void UnitOrder::gradient_complete(size_t flat, bool main, const GradientPath& path) {
  if (main && path.trainable) conductor_.gradient_ready(unit_);
  // The gradients are complete: autograd needs these parameters no more.
  moments_.free_params(flat);
  moments_.settle_gradient(flat, /*counted=*/rate_limited() && main && path.reduced());
}

}  // namespace fsdp
