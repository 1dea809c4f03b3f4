#pragma once
// The step time: each unit's compute (matrix products at the device's FLOP/s, other ops at its
// memory bandwidth, a dispatch cost per op), the optimizer's pass over the shards, and each
// collective's time on its link, overlapped as the planned step issued and waited for them
// (planned_step.h). docs/planner.md ("Step time").

#include "plan/plan_traffic.h"

namespace fsdp::planning {

struct PlannedStep;

/// One collective on its link: its bytes at the link's bandwidth, a latency per ring step.
double collective_seconds(const PlannedCollective& c, const PlanLinks& links);

/// `step`: a micro-batch as the conductor ran it; `program`: the collectives waited for at the
/// end of the step (the program's own, Muon's exchange); `newton_schulz`: the seconds Muon's
/// busiest owner orthogonalizes (0 without Muon).
PlanTime step_time(const PlanSetup& setup, const RankLayout& layout, const PlannedStep& step,
                   const std::vector<PlannedCollective>& program, double newton_schulz = 0);

}  // namespace fsdp::planning
