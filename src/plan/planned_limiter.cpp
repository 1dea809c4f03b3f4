#include "plan/planned_limiter.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace fsdp::planning {

PlannedLimiter::PlannedLimiter(int limit, std::function<void(int)> wait) : count_(limit), wait_(std::move(wait)) {}

bool PlannedLimiter::acquire(bool optional) { return count_.acquire(optional, finishing_oldest()); }

void PlannedLimiter::wait_for_reductions() { count_.wait_for_gradient(finishing_oldest()); }

void PlannedLimiter::reduction_issued(size_t unit, int transfer) {
  count_.reduction_issued();
  in_flight_.push_back({unit, transfer});
}

void PlannedLimiter::finish_oldest() {
  TORCH_INTERNAL_ASSERT(!in_flight_.empty(), "the planned limiter waits with no reduction in flight");
  const InFlight oldest = in_flight_.front();
  in_flight_.pop_front();
  wait_(oldest.transfer);
  count_.reduction_finished();
}

void PlannedLimiter::reduction_waited(size_t unit) {
  auto it = std::find_if(in_flight_.begin(), in_flight_.end(), [unit](const InFlight& r) { return r.unit == unit; });
  if (it == in_flight_.end()) return;
  in_flight_.erase(it);
  count_.reduction_finished();
}

}  // namespace fsdp::planning
