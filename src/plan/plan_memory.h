#pragma once
// One rank's memory through one training step, replayed from the unit layout: the order in which
// a step unshards, prefetches, reshards and reduces (with the engine's rules of
// core/unit_rules.h: prefetch targets, the rate limiter), what autograd keeps and frees, and the
// transients of each piece. The highest point, broken down, is the predicted peak.
// docs/planner.md ("Memory") lists each event and the bytes it moves.

#include "plan/plan_layout.h"

namespace fsdp::planning {

RankMemory replay_step_memory(const PlanSetup& setup, const RankLayout& layout);

}  // namespace fsdp::planning
