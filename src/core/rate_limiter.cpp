#include "core/rate_limiter.h"

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

}  // namespace fsdp
