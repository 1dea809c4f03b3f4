// A unit's own order ([Note: one order inside a unit] in src/core/unit_order.h), tensor-free:
// what the engine's ParamGroup and the planner's PlannedUnit both run, read from a log of what
// the unit, its limiter and the conductor were asked, in turn.
#include "core/step_conductor.h"
#include "core/unit_order.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using Log = std::vector<std::string>;

// A limiter that logs what it is asked and grants every slot but refused prefetches.
class LoggingLimiter final : public fsdp::UnitLimiter {
 public:
  explicit LoggingLimiter(Log& log) : log_(log) {}
  bool acquire(bool optional) override {
    log_.push_back(optional ? "acquire prefetch" : "acquire");
    return !(optional && refuse_prefetch);
  }
  void release() override { log_.push_back("release"); }
  void wait_for_reductions() override { log_.push_back("wait for reductions"); }
  bool refuse_prefetch = false;

 private:
  Log& log_;
};

// A unit for the conductor and its moments for its order, each logged with its name.
class LoggingUnit final : public fsdp::ScheduledUnit, public fsdp::UnitMoments {
 public:
  LoggingUnit(std::string name, bool root, Log& log) : name_(std::move(name)), root_(root), log_(log) {}
  bool is_root() const override { return root_; }
  const std::string& name() const override { return name_; }
  void begin_forward() override {}
  bool issue_unshard(bool optional) override {
    say(optional ? "prefetched" : "unsharded");
    return true;
  }
  void wait_unshard() override {}
  void end_forward(bool) override {}
  void begin_backward(bool) override {}
  bool backward_ran() const override { return false; }
  void finish_backward() override {}

  void issue_gathers() override { say("gathers issued"); }
  void wait_gathers() override { say("gathers waited for"); }
  void allocate_gradients() override { say("gradient allocated"); }
  void free_params(size_t flat) override { say("params " + std::to_string(flat) + " freed"); }
  void settle_gradient(size_t flat, bool counted) override {
    say("gradient " + std::to_string(flat) + (counted ? " reduced, counted" : " settled, not counted"));
  }

 private:
  void say(const std::string& what) { log_.push_back(name_ + ": " + what); }
  std::string name_;
  bool root_;
  Log& log_;
};

// A model of two units under the root, forward run once, BACKWARD_POST: the conductor prefetches
// "a" when "b"'s gradient is ready.
struct TwoUnits {
  explicit TwoUnits(fsdp::BackwardPrefetch prefetch = fsdp::BackwardPrefetch::BackwardPost)
      : options(fsdp::FullyShardOptions().backward_prefetch(prefetch)), conductor(options, listener) {
    for (fsdp::ScheduledUnit* unit : {static_cast<fsdp::ScheduledUnit*>(&root), static_cast<fsdp::ScheduledUnit*>(&a),
                                      static_cast<fsdp::ScheduledUnit*>(&b)}) {
      conductor.pre_forward(*unit);
    }
    log.clear();
  }
  Log log;
  LoggingLimiter limiter{log};
  LoggingUnit root{"root", true, log}, a{"a", false, log}, b{"b", false, log};
  fsdp::FullyShardOptions options;
  fsdp::StepListener listener;
  fsdp::StepConductor conductor;
};

TEST(UnitOrder, AUnitHoldsOneSlotFromItsFirstGatherToItsResharding) {
  TwoUnits m;
  fsdp::UnitOrder order(m.a, m.conductor, m.limiter, m.a);
  EXPECT_TRUE(order.unshard(/*optional=*/false, /*needs_slot=*/true));
  EXPECT_TRUE(order.unshard(/*optional=*/false, /*needs_slot=*/true));  // a group gathered again: no new slot
  order.resharded();
  order.resharded();
  EXPECT_EQ(m.log, (Log{"acquire", "a: gathers issued", "a: gathers issued", "release"}));
  EXPECT_FALSE(order.holds_slot());
}

TEST(UnitOrder, TheRootAndAUnitComputingOnItsShardTakeNoSlot) {
  TwoUnits m;
  fsdp::UnitOrder root(m.root, m.conductor, m.limiter, m.root), a(m.a, m.conductor, m.limiter, m.a);
  EXPECT_TRUE(root.unshard(false, /*needs_slot=*/true));
  EXPECT_TRUE(a.unshard(false, /*needs_slot=*/false));  // NO_SHARD in full precision
  root.resharded();
  a.resharded();
  EXPECT_EQ(m.log, (Log{"root: gathers issued", "a: gathers issued"}));
}

TEST(UnitOrder, APrefetchTheLimiterRefusesGathersNothing) {
  TwoUnits m;
  m.limiter.refuse_prefetch = true;
  fsdp::UnitOrder order(m.a, m.conductor, m.limiter, m.a);
  EXPECT_FALSE(order.unshard(/*optional=*/true, true));
  EXPECT_FALSE(order.holds_slot());
  EXPECT_TRUE(order.unshard(/*optional=*/false, true));
  EXPECT_EQ(m.log, (Log{"acquire prefetch", "acquire", "a: gathers issued"}));
}

TEST(UnitOrder, BackwardWaitsForTheGathersThenTheLimiterThenAllocatesTheGradient) {
  TwoUnits m;
  fsdp::UnitOrder order(m.b, m.conductor, m.limiter, m.b);
  order.begin_backward({/*trainable=*/true});
  EXPECT_EQ(m.log, (Log{"b: gathers waited for", "wait for reductions", "b: gradient allocated"}));
  // No unsharded gradient for the limiter to bound: straight into the shard, kept by no_sync,
  // frozen, or the root's.
  for (fsdp::GradientPath path : {fsdp::GradientPath{true, /*into_shard=*/true}, fsdp::GradientPath{true, false, /*kept=*/true},
                                  fsdp::GradientPath{/*trainable=*/false}}) {
    m.log.clear();
    order.begin_backward(path);
    EXPECT_EQ(m.log, (Log{"b: gathers waited for", "b: gradient allocated"}));
  }
  m.log.clear();
  fsdp::UnitOrder root(m.root, m.conductor, m.limiter, m.root);
  root.begin_backward({true});
  EXPECT_EQ(m.log, (Log{"root: gathers waited for", "root: gradient allocated"}));
}

TEST(UnitOrder, ACompleteGradientIsHeardOfThenItsParametersFreedThenItsReductionCounted) {
  TwoUnits m;
  fsdp::UnitOrder order(m.b, m.conductor, m.limiter, m.b);
  order.gradient_complete(0, /*main=*/true, {true});
  // BACKWARD_POST prefetches "a" while "b" still holds its parameters.
  EXPECT_EQ(m.log, (Log{"a: prefetched", "b: params 0 freed", "b: gradient 0 reduced, counted"}));
}

TEST(UnitOrder, TheLimiterCountsOneReductionPerUnitItsMainGroupsAndNotTheRoots) {
  TwoUnits m(fsdp::BackwardPrefetch::None);
  fsdp::UnitOrder b(m.b, m.conductor, m.limiter, m.b), root(m.root, m.conductor, m.limiter, m.root);
  b.gradient_complete(1, /*main=*/false, {true});                       // another flat group
  b.gradient_complete(0, true, {true, false, false, /*no_sync=*/true});  // kept by no_sync
  b.gradient_complete(0, true, {true, /*into_shard=*/true});
  b.gradient_complete(0, true, {/*trainable=*/false});
  root.gradient_complete(0, true, {true});
  EXPECT_EQ(m.log, (Log{"b: params 1 freed", "b: gradient 1 settled, not counted", "b: params 0 freed",
                        "b: gradient 0 settled, not counted", "b: params 0 freed", "b: gradient 0 settled, not counted",
                        "b: params 0 freed", "b: gradient 0 settled, not counted", "root: params 0 freed",
                        "root: gradient 0 settled, not counted"}));
}

TEST(UnitOrder, AFrozenMainGroupStartsNoBackwardPostPrefetch) {
  TwoUnits m;
  fsdp::UnitOrder order(m.b, m.conductor, m.limiter, m.b);
  order.gradient_complete(0, /*main=*/true, {/*trainable=*/false});
  EXPECT_EQ(m.log, (Log{"b: params 0 freed", "b: gradient 0 settled, not counted"}));
}

}  // namespace
