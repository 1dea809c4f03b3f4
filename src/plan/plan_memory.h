#pragma once
// One rank's memory through one training step, replayed from the unit layout: the order in which
// FsdpState unshards, prefetches, reshards and reduces, what autograd keeps and frees, and the
// transients of each piece. The highest point, broken down, is the predicted peak.
// docs/planner.md ("Memory") lists each event and the bytes it moves.

#include "plan/plan_layout.h"

namespace fsdp::planning {

RankMemory replay_step_memory(const PlanSetup& setup, const RankLayout& layout);

}  // namespace fsdp::planning
