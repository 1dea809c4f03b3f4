#pragma once
// The rate limiter of the planned step: the engine's counts and rules (core/limiter_count.h), one
// limiter for the step's planned units as the engine's model has one for its units. Where the
// engine's limiter blocks until the communication thread ends a reduction, this one has compute
// wait for the oldest reduction in flight (a Wait event the step-time model replays), which ends
// it ([Note: one order inside a unit] in core/unit_order.h).

#include "core/limiter_count.h"
#include "core/unit_order.h"

#include <cstddef>
#include <deque>
#include <functional>

namespace fsdp::planning {

class PlannedLimiter final : public UnitLimiter {
 public:
  /// `wait(transfer)`: compute waits for the transfer (-1: one that moves nothing).
  PlannedLimiter(int limit, std::function<void(int)> wait);

  bool acquire(bool optional) override;
  void release() override { count_.release(); }
  void wait_for_reductions() override;

  /// Unit `unit`'s counted reduction was issued as `transfer`: in flight until waited for.
  void reduction_issued(size_t unit, int transfer);
  /// The end of backward waits for `unit`'s reduction: it ends, if the limiter still counts it.
  void reduction_waited(size_t unit);

 private:
  struct InFlight {
    size_t unit;
    int transfer;
  };
  /// LimiterCount's way to wait: compute waits for the oldest reduction until done() holds.
  auto finishing_oldest() {
    return [this](auto done) {
      while (!done()) finish_oldest();
    };
  }
  void finish_oldest();

  LimiterCount count_;
  std::deque<InFlight> in_flight_;  // oldest first
  std::function<void(int)> wait_;
};

}  // namespace fsdp::planning
