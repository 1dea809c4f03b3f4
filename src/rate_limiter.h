#pragma once
// The rate limiter of the paper's section 3.4: at most `limit` units (the root aside) hold
// unsharded parameters or gradients at once, so a host that runs ahead of the collectives cannot
// pile up unsharded buffers. Units release from the communication thread once their
// reduce-scatter has freed the unsharded gradient, hence the lock.

#include <condition_variable>
#include <mutex>

namespace fsdp {

class RateLimiter {
 public:
  explicit RateLimiter(int limit) : limit_(limit) {}

  /// A unit is about to allocate unsharded memory. Waits while `limit` units hold some and one of
  /// them will free it (its reduce-scatter is pending). Then a prefetch (`optional`) still at the
  /// limit is refused (returns false); a unit that must run now always proceeds.
  bool acquire(bool optional);
  /// A unit freed all its unsharded memory.
  void release();
  /// A reduce-scatter that will end in release() was issued / has finished.
  void reduction_issued();
  void reduction_finished();


 private:
  bool over_limit() const { return limit_ > 0 && held_ >= limit_; }

  const int limit_;
  std::mutex mutex_;
  std::condition_variable freed_;
  int held_ = 0;
  int pending_reductions_ = 0;
};

}  // namespace fsdp
