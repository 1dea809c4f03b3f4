#pragma once
// What the planner can plan: sizes it counts in int64 without overflow and work it does in
// seconds. A setup beyond either is refused before any replay, naming the bound.

#include <fsdp/plan.h>

#include <cstdint>
#include <vector>

namespace fsdp::planning {

/// Bytes per rank beyond which a plan is refused (1 EiB): beyond any device, and far enough from
/// int64's 2^63 that the replay's sums and the traffic's products of these sizes cannot wrap.
constexpr int64_t kMaxPlanBytes = int64_t{1} << 60;
/// Units (the root included) times ranks that one plan replays: ~2 s on a loaded CPU.
constexpr int64_t kMaxUnitRanks = int64_t{1} << 22;

/// The root, then model.units in order.
std::vector<const PlanUnit*> units_of(const PlanModel& model);

/// Throws naming the bound when `setup` is more work than kMaxUnitRanks or counts more than
/// kMaxPlanBytes per rank (every element's states at 32 bytes, every activation at once).
void check_plan_bounds(const PlanSetup& setup);

}  // namespace fsdp::planning
