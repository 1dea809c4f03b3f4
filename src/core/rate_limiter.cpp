#include "core/rate_limiter.h"

namespace fsdp {

bool RateLimiter::acquire(bool optional) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (over_limit() && optional) return false;  // held_ is the same on every rank
  if (limit_ > 0) {
    const int in_flight = over_limit() ? 0 : kReductionsInFlight;
    freed_.wait(lock, [&] { return pending_reductions_ <= in_flight; });
  }
  ++held_;
  return true;
}

void RateLimiter::wait_for_reductions() {
  if (limit_ <= 0) return;
  std::unique_lock<std::mutex> lock(mutex_);
  freed_.wait(lock, [&] { return pending_reductions_ <= kReductionsInFlight; });
}

void RateLimiter::release() {
  std::lock_guard<std::mutex> lock(mutex_);
  --held_;
}

void RateLimiter::reduction_issued() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++pending_reductions_;
}

void RateLimiter::reduction_finished() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --pending_reductions_;
  }
  freed_.notify_all();
}

}  // namespace fsdp
