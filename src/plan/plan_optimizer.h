#pragma once
// The optimizer a plan steps (PlanPolicy::optimizer), in the bytes the replays count: its state
// and its step's memory traffic per parameter element, from its description
// ([Note: what an optimizer keeps, once] in optim/optimizer_kinds.h).

#include <fsdp/plan.h>

#include <cstdint>

namespace fsdp::planning {

struct OptimizerBytes {
  int64_t state_per_element = 0;  ///< its state tensors (AdamW: exp_avg and exp_avg_sq)
  int64_t step_per_element = 0;   ///< what one step reads and writes (AdamW: 7 elements' worth)
};

/// `optimizer`'s bytes per parameter element of `element_bytes` (the shard's dtype). Throws naming
/// the optimizers known when it is none of them, or an option it lacks.
OptimizerBytes optimizer_bytes(const PlanOptimizer& optimizer, int64_t element_bytes);

}  // namespace fsdp::planning
