// The rate limiter's counts and rules (src/core/limiter_count.h), which the engine's RateLimiter
// waits on under its lock and the planner's limiter counts with: checked without threads, a wait
// being "end the oldest reduction until allowed", as the planner's limiter waits. What the
// engine's blocking waits add (threads, the communication thread's ends) is rate_limiter_test.cpp's.
#include "core/limiter_count.h"

#include <gtest/gtest.h>

namespace {

// A wait as the planner's limiter waits: the oldest reduction ends until done() holds. `ended`
// counts them.
auto ending_oldest(fsdp::LimiterCount& count, int& ended) {
  return [&count, &ended](auto done) {
    while (!done()) {
      count.reduction_finished();
      ++ended;
    }
  };
}

TEST(LimiterCount, AGradientAndASlotBelowTheLimitWaitUntilOneReductionIsInFlight) {
  fsdp::LimiterCount count(2);
  for (int i = 0; i < 3; ++i) count.reduction_issued();
  int ended = 0;
  count.wait_for_gradient(ending_oldest(count, ended));
  EXPECT_EQ(ended, 2);
  EXPECT_EQ(count.in_flight(), 1);
  count.reduction_issued();
  EXPECT_TRUE(count.acquire(/*optional=*/true, ending_oldest(count, ended)));
  EXPECT_EQ(ended, 3);
  EXPECT_EQ(count.in_flight(), 1);
  EXPECT_EQ(count.held(), 1);
}

TEST(LimiterCount, AtTheLimitAPrefetchIsRefusedAtOnceAndAUnitThatMustRunWaitsForEveryReduction) {
  fsdp::LimiterCount count(1);
  int ended = 0;
  ASSERT_TRUE(count.acquire(false, ending_oldest(count, ended)));
  count.reduction_issued();
  count.reduction_issued();
  EXPECT_FALSE(count.acquire(/*optional=*/true, ending_oldest(count, ended)));
  EXPECT_EQ(ended, 0) << "a refusal waits for nothing";
  EXPECT_TRUE(count.acquire(/*optional=*/false, ending_oldest(count, ended)));
  EXPECT_EQ(ended, 2);
  EXPECT_EQ(count.held(), 2);
  count.release();
  count.release();
  EXPECT_EQ(count.held(), 0);
}

TEST(LimiterCount, ZeroLimitsNothingAndWaitsForNothing) {
  fsdp::LimiterCount count(0);
  for (int i = 0; i < 3; ++i) count.reduction_issued();
  int ended = 0;
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(count.acquire(/*optional=*/true, ending_oldest(count, ended)));
  count.wait_for_gradient(ending_oldest(count, ended));
  EXPECT_EQ(ended, 0);
  EXPECT_EQ(count.in_flight(), 3);
}

}  // namespace
