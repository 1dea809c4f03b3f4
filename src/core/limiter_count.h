#pragma once
// The rate limiter's counts and rules, tensor-free and without a lock: how many units hold a slot
// (unsharded parameters), how many counted reductions are in flight, what a prefetch is refused
// and how many reductions a unit waits for. The engine's RateLimiter (core/rate_limiter.h) keeps
// one under its mutex and waits on a condition variable; the planner's limiter
// (src/plan/planned_limiter.h) keeps one and "waits" by having compute wait for the oldest
// reduction. Each passes its own way of waiting to acquire() and wait_for_gradient(), so what is
// refused and what is waited for is written here once ([Note: one order inside a unit] in
// core/unit_order.h; [Note: rate limiter slots] in core/rate_limiter.h).

#include <climits>

namespace fsdp {

class LimiterCount {
 public:
  /// At most `limit` units hold unsharded parameters at once (0: no limit, no waiting).
  explicit LimiterCount(int limit) : limit_(limit) {}

  /// A unit is about to unshard. A prefetch (`optional`) at the limit is refused: false, at once
  /// (the slots held are the same on every rank). Else `wait_until(done)` returns once done()
  /// holds (below the limit: at most one reduction in flight; a unit that must run at the limit:
  /// none), and the unit holds a slot.
  template <class WaitUntil>
  bool acquire(bool optional, WaitUntil&& wait_until) {
    if (optional && at_limit()) return false;
    const int allowed = at_limit() ? 0 : kReductionsInFlight;
    wait_until([this, allowed] { return within(allowed); });
    ++held_;
    return true;
  }
  /// A unit freed its unsharded parameters.
  void release() { --held_; }

  /// A unit is about to allocate its unsharded gradient: `wait_until(done)` returns once at most
  /// one reduction is in flight.
  template <class WaitUntil>
  void wait_for_gradient(WaitUntil&& wait_until) {
    wait_until([this] { return within(kReductionsInFlight); });
  }

  /// A counted reduction was issued / has ended (its unsharded gradient is freed).
  void reduction_issued() { ++in_flight_; }
  void reduction_finished() { --in_flight_; }

  int held() const { return held_; }
  int in_flight() const { return in_flight_; }

 private:
  /// Reductions left in flight while the next unit allocates its unsharded gradient: the
  /// gradients of the ones before are freed by then.
  static constexpr int kReductionsInFlight = 1;

  bool on() const { return limit_ > 0; }
  bool at_limit() const { return on() && held_ >= limit_; }
  /// No limit: nothing is waited for.
  bool within(int allowed) const { return !on() || in_flight_ <= allowed; }

  const int limit_;
  int held_ = 0;
  int in_flight_ = 0;
};

}  // namespace fsdp
