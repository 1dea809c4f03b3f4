// A sharded model held unsharded across forwards and backwards ([Note: units held unsharded]).
#include "core/unshard_hold.h"

#include "core/fsdp_state.h"
#include "core/param_group.h"
#include "core/sharded_model.h"

#include <c10/util/Exception.h>

namespace fsdp::detail {

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
