#pragma once
// The optimizer a plan steps (PlanPolicy::optimizer), in the bytes the replays count: its state
// and its step's memory traffic per parameter element, from its description
// ([Note: what an optimizer keeps, once] in optim/optimizer_kinds.h). A Muon plan is two
// optimizers: Muon on the hidden matrices, AdamW on the rest ([Note: Muon in the plan]).

#include <fsdp/plan.h>

#include <cstdint>

namespace fsdp::planning {

struct OptimizerBytes {
  int64_t state_per_element = 0;  ///< its state tensors (AdamW: exp_avg and exp_avg_sq)
  int64_t step_per_element = 0;   ///< what one step reads and writes (AdamW: 7 elements' worth)
};

/// `optimizer`'s bytes per parameter element of `element_bytes` (the shard's dtype); of a Muon
/// plan, Muon's own (its momentum). Throws naming the optimizers known when it is none of them,
/// or an option it lacks.
OptimizerBytes optimizer_bytes(const PlanOptimizer& optimizer, int64_t element_bytes);

/// Bytes of the optimizers stepping `piece_numel` trainable elements of `element_bytes`, of which
/// `muon_numel` are Muon's matrices (a Muon plan; the rest AdamW's; 0 in any other plan).
struct OptimizerTotals {
  int64_t state = 0;  ///< kept
  int64_t step = 0;   ///< read and written by one step
};
OptimizerTotals optimizer_totals(const PlanOptimizer& optimizer, int64_t piece_numel, int64_t muon_numel,
                                 int64_t element_bytes);

}  // namespace fsdp::planning
