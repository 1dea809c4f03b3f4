#include "core/rate_limiter.h"

#include "util/trace.h"

namespace fsdp {

bool RateLimiter::acquire(bool optional) {
  std::unique_lock<std::mutex> lock(mutex_);
  return count_.acquire(optional, blocking(lock));  // refused or not: the same on every rank
}

void RateLimiter::wait_for_reductions() {
  std::unique_lock<std::mutex> lock(mutex_);
  count_.wait_for_gradient(blocking(lock));
}

void RateLimiter::release() {
  std::lock_guard<std::mutex> lock(mutex_);
  count_.release();
}

void RateLimiter::reduction_issued() {
  std::lock_guard<std::mutex> lock(mutex_);
  count_.reduction_issued();
}

void RateLimiter::reduction_finished() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    count_.reduction_finished();
  }
  freed_.notify_all();
}

bool TracedLimiter::acquire(bool optional) {
  TraceSpan waiting("wait rate_limiter", label_, TraceLane::Waits);
  return limiter_.acquire(optional);
}

void TracedLimiter::wait_for_reductions() {
  TraceSpan waiting("wait rate_limiter", label_, TraceLane::Waits);
  limiter_.wait_for_reductions();
}

}  // namespace fsdp
