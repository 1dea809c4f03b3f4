#pragma once
// The step time: each unit's compute (matrix products at the device's FLOP/s, other ops at its
// memory bandwidth, a dispatch cost per op), the optimizer's pass over the shards, and each
// collective's time on its link, overlapped as the planned step issued and waited for them
// (planned_step.h). docs/planner.md ("Step time").

#include "plan/plan_traffic.h"

namespace fsdp::planning {

struct PlannedStep;

/// `step`: a micro-batch as the conductor ran it; `program`: the program's own collectives,
/// waited for at the end of the step.
PlanTime step_time(const PlanSetup& setup, const RankLayout& layout, const PlannedStep& step,
                   const std::vector<PlannedCollective>& program);

}  // namespace fsdp::planning
