// The rate limiter's contract ([Note: rate limiter slots] in src/core/rate_limiter.h): whether a
// prefetch is refused depends only on the slots the caller's thread holds, never on reductions in
// flight (that would let ranks issue different collectives); below the limit a unit waits while
// more than one reduce-scatter is in flight; a unit that must run at the limit waits for all.
#include "device/device.h"
#include "core/rate_limiter.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>

namespace {

using namespace std::chrono_literals;

// Runs acquire(optional) on another thread; reports whether it returned within `patience`.
class Acquirer {
 public:
  Acquirer(fsdp::RateLimiter& limiter, bool optional)
      : thread_([this, &limiter, optional] {
          granted_ = limiter.acquire(optional);
          done_ = true;
        }) {}
  ~Acquirer() { thread_.join(); }
  bool done_within(std::chrono::milliseconds patience) const {
    const auto end = std::chrono::steady_clock::now() + patience;
    while (!done_ && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(1ms);
    return done_;
  }
  bool granted() const { return granted_; }

 private:
  std::atomic<bool> done_{false}, granted_{false};
  std::thread thread_;
};

TEST(RateLimiter, APrefetchAtTheLimitIsRefusedAtOnceEvenWithReductionsInFlight) {
  fsdp::RateLimiter limiter(2);
  ASSERT_TRUE(limiter.acquire(/*optional=*/false));
  ASSERT_TRUE(limiter.acquire(/*optional=*/true));
  limiter.reduction_issued();
  limiter.reduction_issued();
  Acquirer prefetch(limiter, /*optional=*/true);
  EXPECT_TRUE(prefetch.done_within(2s)) << "a refusal must not wait for the reductions";
  EXPECT_FALSE(prefetch.granted());
  limiter.reduction_finished();
  limiter.reduction_finished();
}

TEST(RateLimiter, BelowTheLimitOneReductionInFlightIsAllowedAndTwoWait) {
  fsdp::RateLimiter limiter(2);
  ASSERT_TRUE(limiter.acquire(false));  // the unit whose backward runs
  limiter.reduction_issued();
  {
    Acquirer prefetch(limiter, /*optional=*/true);  // one in flight: goes ahead
    EXPECT_TRUE(prefetch.done_within(2s));
    EXPECT_TRUE(prefetch.granted());
  }
  limiter.release();
  limiter.reduction_issued();  // two in flight now, one slot held
  Acquirer prefetch(limiter, /*optional=*/true);
  EXPECT_FALSE(prefetch.done_within(100ms)) << "two unsharded gradients in flight: must wait";
  limiter.reduction_finished();
  EXPECT_TRUE(prefetch.done_within(2s));
  EXPECT_TRUE(prefetch.granted());
  limiter.reduction_finished();
}

TEST(RateLimiter, AUnitThatMustRunAtTheLimitWaitsForEveryReduction) {
  fsdp::RateLimiter limiter(1);
  ASSERT_TRUE(limiter.acquire(false));
  limiter.reduction_issued();
  Acquirer required(limiter, /*optional=*/false);
  EXPECT_FALSE(required.done_within(100ms));
  limiter.reduction_finished();
  EXPECT_TRUE(required.done_within(2s));
  EXPECT_TRUE(required.granted());
}

// A reduce-scatter's task holds a ReductionEnd (src/core/param_group.cpp): after one collective fails,
// the communication thread skips the tasks behind it without running them, and destroying them
// must still end their count, or a unit waiting for every reduction would hang.
TEST(RateLimiter, ReductionsSkippedAfterAFailureStillEnd) {
  fsdp::RateLimiter limiter(1);
  ASSERT_TRUE(limiter.acquire(false));
  auto device = fsdp::make_device(c10::Device(c10::kCPU));
  std::vector<fsdp::CommHandle> handles;
  for (int i = 0; i < 2; ++i) {
    limiter.reduction_issued();
    auto end = std::make_shared<fsdp::ReductionEnd>(&limiter);
    handles.push_back(device->submit(
        fsdp::CommLane::Reduce,
        [end, i] {
          std::this_thread::sleep_for(50ms);  // the unit below is waiting by then
          if (i == 0) throw std::runtime_error("a peer died");
        },
        /*overlap_bytes=*/int64_t{1} << 30));  // on the communication thread
  }
  Acquirer required(limiter, /*optional=*/false);
  const bool done = required.done_within(5s);
  if (!done) limiter.reduction_finished();  // let the waiter go, so that the test ends
  EXPECT_TRUE(done) << "a skipped reduction never ended";
  EXPECT_THROW(handles[1].wait(), std::exception);
}

TEST(RateLimiter, ZeroMeansNoLimit) {
  fsdp::RateLimiter limiter(0);
  for (int i = 0; i < 3; ++i) limiter.reduction_issued();
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(limiter.acquire(/*optional=*/true));
}

}  // namespace

namespace {

// A unit that never unshards (NO_SHARD in full precision) still allocates an unsharded gradient
// per backward: before it does, it waits until at most one reduction is in flight.
TEST(RateLimiter, AGradientWaitsWhileTwoReductionsAreInFlight) {
  fsdp::RateLimiter limiter(2);
  limiter.reduction_issued();
  limiter.reduction_issued();
  std::atomic<bool> done{false};
  std::thread gradient([&] {
    limiter.wait_for_reductions();
    done = true;
  });
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(done) << "two reductions in flight: the gradient must wait";
  limiter.reduction_finished();
  const auto end = std::chrono::steady_clock::now() + 2s;
  while (!done && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(done) << "one reduction in flight: the gradient goes ahead";
  gradient.join();
  limiter.reduction_finished();
}

}  // namespace
