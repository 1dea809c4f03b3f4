#pragma once
// [Note: one sharding pipeline]
// fully_shard (every unit at once) and fully_shard_deferred (each unit as its factory builds it,
// then the root) turn parameters into units by the same steps, in this order:
//  1. place: the module moves to the compute device (offloaded: only its buffers);
//  2. collect: each parameter once, in the innermost unit that holds it (a tie under its first
//     name); fully_shard plans the whole model, a deferred unit takes what no inner unit took;
//  3. initialise: the user's ParamInit, without recording gradients;
//  4. verify: every rank holds the same parameters (verify_model), before any collective
//     touches them, and, unless step 5 makes them rank 0's, the same initial values (one
//     all-reduce of their checksums);
//  5. sync: every rank takes rank 0's values (sync_module_states);
//  6. build: the unit's flat parameter groups ([Note: full-precision modules]).
// Steps 3-6 are shard_units; fully_shard then syncs and casts the buffers of the whole model.

#include "core/fsdp_state.h"
#include "core/model_check.h"
#include "core/unit_groups.h"

#include <fsdp/unit_runtime.h>

#include <string>
#include <unordered_set>
#include <vector>

namespace fsdp::detail {

/// One fully_shard_deferred call: the model its factory's units are sharded into, and their init.
struct DeferredSharding {
  std::shared_ptr<FsdpState> state;
  ParamInit init;
  UnitPrepare prepare;
  std::unordered_set<const c10::TensorImpl*> sharded;  // parameters already in some unit's shard
  int units = 0;
};

/// One unit on its way through the pipeline.
struct UnitToShard {
  std::string name;           ///< module path; "" for the root; "deferred unit #N" while deferred
  UnitSlot* slot = nullptr;   ///< where its Unit holder finds it
  NamedTensors params;         ///< step 2's result
  bool presharded = false;    ///< built and sharded by fully_shard_deferred already
  bool is_root = false;
  torch::nn::Module* module = nullptr;  ///< its module, for fully_shard_deferred's UnitPrepare
};

/// Step 1.
void place_on_device(torch::nn::Module& module, const c10::Device& device, bool offload);

/// Steps 3-6 for every plan that is not presharded (presharded ones are verified with them, in
/// plan order): their units are appended to state.units() and their slots filled in.
void shard_units(FsdpState& state, std::vector<UnitToShard>& plans, const ParamInit& init,
                 const UnitPrepare& prepare, const TensorSet& full_precision);

/// Makes every rank's tensors equal to rank 0's.
void broadcast_from_rank0(const std::vector<at::Tensor>& tensors, ProcessGroup& world);

}  // namespace fsdp::detail
