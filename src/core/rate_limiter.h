#pragma once
// The rate limiter of the paper's section 3.4, so that a host that runs ahead of the collectives
// cannot pile up unsharded buffers: at most `limit` units (the root aside) hold unsharded
// parameters at once (each also accumulates its gradient while its backward runs), and at most
// one more unit's unsharded gradient waits for its reduce-scatter. With limit 2 that is two
// units' parameters and gradients, the bound bench/run_bench.py holds peak memory to.
//
// [Note: rate limiter slots]
// A slot is taken when a unit starts unsharding and given back when its parameters are freed
// (core/unit_order.h: [Note: one order inside a unit]), both on the caller's thread, so whether a prefetch is refused (the limit is reached) is the same
// on every rank ([Note: collective order]). Reductions end on the communication thread, at times
// that differ between ranks: they only make a unit wait, never change what is issued. A slot does
// not wait for its unit's reduce-scatter (it did once): backward then stalled before every unit
// until the peer ranks had finished the one before, i.e. a barrier per unit with no slack.

#include "core/limiter_count.h"
#include "core/unit_order.h"

#include <condition_variable>
#include <mutex>
#include <string>

namespace fsdp {

/// The limiter one model's units share: LimiterCount's rules, its waits blocking the caller's thread
/// until the communication thread ends enough reductions.
class RateLimiter final : public UnitLimiter {
 public:
  explicit RateLimiter(int limit) : count_(limit) {}

  /// A unit is about to unshard its parameters. A prefetch (`optional`) at the limit is refused
  /// (returns false); a unit that must run now always proceeds, once every reduction has ended.
  /// Below the limit it waits until at most one reduce-scatter is in flight.
  bool acquire(bool optional) override;
  /// A unit freed its unsharded parameters.
  void release() override;
  /// A unit is about to allocate its unsharded gradient: waits until at most one reduce-scatter
  /// is in flight. acquire() waits so too, but a unit that never unshards (NO_SHARD in full
  /// precision) never calls it, and its gradients would queue behind a slow all-reduce unbounded.
  void wait_for_reductions() override;
  /// A reduce-scatter of an unsharded gradient was issued / has freed that gradient.
  void reduction_issued();
  void reduction_finished();

 private:
  /// LimiterCount's way to wait: on the condition variable, under the lock.
  auto blocking(std::unique_lock<std::mutex>& lock) {
    return [this, &lock](auto done) { freed_.wait(lock, done); };
  }

  std::mutex mutex_;
  std::condition_variable freed_;
  LimiterCount count_;  // under mutex_
};

/// One unit's view of its model's RateLimiter: the same limiter, its waits traced under the unit's
/// label (--trace: "wait rate_limiter").
class TracedLimiter final : public UnitLimiter {
 public:
  TracedLimiter(RateLimiter& limiter, const std::string& label) : limiter_(limiter), label_(label) {}
  bool acquire(bool optional) override;
  void release() override { limiter_.release(); }
  void wait_for_reductions() override;

 private:
  RateLimiter& limiter_;
  const std::string& label_;  // the unit's, which may be renamed
};

/// Calls reduction_finished() when destroyed (if given a limiter). A reduce-scatter's task holds
/// one: the communication thread destroys every task it dequeues, also one it skips after an
/// earlier failure, which never runs.
class ReductionEnd {
 public:
  explicit ReductionEnd(RateLimiter* limiter) : limiter_(limiter) {}
  ~ReductionEnd() {
    if (limiter_) limiter_->reduction_finished();
  }
  ReductionEnd(const ReductionEnd&) = delete;
  ReductionEnd& operator=(const ReductionEnd&) = delete;

 private:
  RateLimiter* limiter_;
};

}  // namespace fsdp
