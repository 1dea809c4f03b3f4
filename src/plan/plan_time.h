#pragma once
// The step time: each unit's compute (matrix products at the device's FLOP/s, other ops at its
// memory bandwidth, a dispatch cost per op), the optimizer's pass over the shards, and each
// collective's time on its link; prefetch hides a unit's all-gather behind the compute of the
// unit before it, a reduction behind the backward of the unit after it. docs/planner.md ("Time").

#include "plan/plan_traffic.h"

namespace fsdp::planning {

PlanTime step_time(const PlanSetup& setup, const RankLayout& layout,
                   const std::vector<PlannedCollective>& collectives);

}  // namespace fsdp::planning
