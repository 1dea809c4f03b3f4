// The planned step waits where the engine's rate limiter waits: it runs the engine's order inside
// a unit with the limiter's own counts ([Note: one order inside a unit] in src/core/unit_order.h),
// so before a unit's backward computes, every reduction but the one before it has been waited for
// (one stays in flight), and without a limit none is until the end of backward.
#include "plan/plan_layout.h"
#include "plan/planned_step.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

namespace {

// A root and four units of one 64 x 64 matrix each, on two ranks.
fsdp::PlanSetup four_units(int limit) {
  fsdp::PlanSetup s;
  auto unit = [](const std::string& name) {
    fsdp::PlanUnit u;
    u.name = name;
    u.params = {{"weight", {64, 64}}};
    u.activations = {4096, 1024, 512, 2048};
    return u;
  };
  s.model.root = unit("");
  for (int i = 0; i < 4; ++i) s.model.units.push_back(unit("h." + std::to_string(i)));
  s.model.sequence_tokens = 16;
  s.world = {2, 2};
  s.policy.fsdp.limit_all_gathers(limit);
  return s;
}

// For each unit's backward (by unit index), the units whose reductions compute waited for before it
// computed; `end`: those waited for after the last one (the end of backward).
struct ReductionWaits {
  std::map<size_t, std::set<size_t>> before_backward;
  std::set<size_t> end;
};

ReductionWaits reduction_waits(const fsdp::planning::PlannedStep& step) {
  ReductionWaits waits;
  std::set<size_t> waited;
  for (const auto& e : step.events) {
    if (e.kind == fsdp::planning::PlannedEvent::Backward) waits.before_backward[e.index] = waited;
    const bool reduction = e.kind == fsdp::planning::PlannedEvent::Wait &&
                           step.transfers[e.index].kind == fsdp::planning::PlannedTransfer::Reduction;
    if (reduction) waited.insert(step.transfers[e.index].unit);
  }
  waits.end = waited;
  return waits;
}

fsdp::planning::PlannedStep planned(const fsdp::PlanSetup& s) {
  return fsdp::planning::run_planned_step(s, fsdp::planning::layout_for_rank(s, 0), fsdp::planning::MicroBatch{}, {},
                                          "");
}

TEST(Planner, BackwardWaitsForEveryReductionButTheOneBeforeItAsTheEngineLimiterDoes) {
  const ReductionWaits waits = reduction_waits(planned(four_units(2)));
  // Backward reaches the units in reverse: h.3 (unit 4) first, each reduced as it completes.
  EXPECT_EQ(waits.before_backward.at(4), (std::set<size_t>{}));
  EXPECT_EQ(waits.before_backward.at(3), (std::set<size_t>{}));     // unit 4's in flight
  EXPECT_EQ(waits.before_backward.at(2), (std::set<size_t>{4}));    // unit 3's in flight
  EXPECT_EQ(waits.before_backward.at(1), (std::set<size_t>{4, 3}));  // unit 2's in flight
  EXPECT_EQ(waits.end, (std::set<size_t>{0, 1, 2, 3, 4}));
}

TEST(Planner, WithoutALimitBackwardWaitsForNoReductionUntilItEnds) {
  const ReductionWaits waits = reduction_waits(planned(four_units(0)));
  for (const auto& [unit, before] : waits.before_backward) EXPECT_TRUE(before.empty()) << "unit " << unit;
  EXPECT_EQ(waits.end, (std::set<size_t>{0, 1, 2, 3, 4}));
}

}  // namespace
