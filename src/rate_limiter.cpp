#include "rate_limiter.h"

namespace fsdp {

bool RateLimiter::acquire(bool optional) {
  std::unique_lock<std::mutex> lock(mutex_);
  freed_.wait(lock, [&] { return !over_limit() || pending_reductions_ == 0; });
  // [Note: collective order] Refusing is decided only once no reduction is pending, when held_
  // counts units whose parameters the caller's thread unsharded: the same on every rank. Deciding
  // on how far the communication thread has got would let ranks issue different collectives.
  if (optional && over_limit()) return false;
  ++held_;
  return true;
}

void RateLimiter::release() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --held_;
  }
  freed_.notify_all();
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
