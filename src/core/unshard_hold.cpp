// A sharded model held unsharded across forwards and backwards.
#include "core/unshard_hold.h"

#include "core/fsdp_state.h"
#include "core/param_group.h"
#include "core/sharded_model.h"

#include <c10/util/Exception.h>

namespace fsdp::detail {

// [Note: units held unsharded]
// A pipeline stage runs several forwards and backwards (its micro-batches) per step: it gathers
// its units once, holds them unsharded (the conductor's flag: neither a forward's end nor a
// backward's reshards them) with no_sync on, so every backward adds into the kept unsharded
// gradient, and reduces that sum once, after its last backward (ParamGroup::
// reduce_kept_gradients: the reduction a synchronising backward would issue, with its dtype, the
// division by the ranks and the addition to a gradient the optimizer kept). Released, the units
// reshard; gradients not reduced yet stay kept, so a stage may reshard between micro-batches and
// gather again (PipelineOptions::reshard_after_microbatch) and still reduce once.

void hold_unsharded(const ShardedModel& model) {
  FsdpState& state = engine_of(model);
  state.set_hold_unsharded(true);
  state.set_no_sync(true);
  for (auto& unit : state.units()) {
    unit->take_in_rebound_params();  // [Note: a parameter rebound from outside]
    unit->wait_unshard();
  }
}

void reduce_held_gradients(const ShardedModel& model) {
  auto& units = engine_of(model).units();
  // Reverse forward order, as a backward would issue them.
  for (auto it = units.rbegin(); it != units.rend(); ++it) (*it)->reduce_kept_gradients();
}

void release_unsharded(const ShardedModel& model) {
  FsdpState& state = engine_of(model);
  state.set_hold_unsharded(false);
  state.set_no_sync(false);
  for (auto& unit : state.units()) {
    TORCH_CHECK(unit->reshard_unless_in_backward(), "fsdp: unit '", unit->name(),
                "' cannot reshard while its backward is under way; release a held model between passes");
  }
}

}  // namespace fsdp::detail
