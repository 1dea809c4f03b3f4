#pragma once
// The step time: each unit's compute (matrix products at the device's FLOP/s, other ops at its
// memory bandwidth, a dispatch cost per op), the optimizer's pass over the shards, and each
// collective's time on its link, overlapped as the planned step issued and waited for them
// (planned_step.h). docs/planner.md ("Step time").

#include "plan/plan_traffic.h"

namespace fsdp::planning {

struct PlannedStep;

/// One unit's forward and backward at `r` for the setup's batch: each kind of its work at the
/// device's rate for it; with activation checkpointing (not the root) a second forward first.
struct UnitSeconds {
  double forward = 0, backward = 0;
};
UnitSeconds unit_seconds(const PlanUnit& unit, const PlanSetup& setup, const KernelRates& r, bool is_root);

/// One collective on its link: its bytes at the link's bandwidth, a latency per ring step.
double collective_seconds(const PlannedCollective& c, const PlanLinks& links);

/// `step`: a micro-batch as the conductor ran it; `program`: the collectives waited for at the
/// end of the step (the program's own, Muon's exchange); `newton_schulz`: the seconds Muon's
/// busiest owner orthogonalizes (0 without Muon).
PlanTime step_time(const PlanSetup& setup, const RankLayout& layout, const PlannedStep& step,
                   const std::vector<PlannedCollective>& program, double newton_schulz = 0);

}  // namespace fsdp::planning
