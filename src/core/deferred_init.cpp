// Deferred initialisation (paper, section 3.1): while a fully_shard_deferred factory runs, every
// fsdp::Unit holder it constructs shards its module at once, so the whole model never exists on
// one rank. The units get their module paths, and the root its own flat parameter, when the
// factory has returned (shard_model).
#include <fsdp/unit_runtime.h>

#include "core/shard_pipeline.h"
#include "core/unit_slot.h"

#include <c10/util/Exception.h>

#include <unordered_set>
#include <vector>

namespace fsdp::detail {

namespace {
thread_local DeferredSharding* active = nullptr;
}  // namespace

DeferredScope::DeferredScope(ProcessGroup& group, const FullyShardOptions& options, ParamInit init,
                             UnitPrepare prepare)
    : sharding_(std::make_unique<DeferredSharding>()) {
  options.validate(group.size(), group.settings().local_world_size);
  TORCH_CHECK(!active, "fully_shard_deferred: its factory built another deferred model");
  sharding_->state =
      std::make_shared<FsdpState>(group, options, options.device().value_or(c10::Device(c10::kCPU)));
  sharding_->init = std::move(init);
  sharding_->prepare = std::move(prepare);
  active = sharding_.get();
}

DeferredScope::~DeferredScope() { close(); }

void DeferredScope::close() {
  if (active == sharding_.get()) active = nullptr;
}

// The pipeline of [Note: one sharding pipeline] for one unit, as its Unit holder is constructed.
void shard_if_deferred(UnitSlot& slot, const std::shared_ptr<torch::nn::Module>& module) {
  if (!active || slot.unit) return;
  DeferredSharding& sharding = *active;
  FsdpState& state = *sharding.state;
  // Built where the factory runs, sharded where the model computes.
  place_on_device(*module, state.compute_device(), state.options().cpu_offload());
  std::vector<UnitToShard> plans(1);
  UnitToShard& plan = plans[0];
  plan.name = "deferred unit #" + std::to_string(sharding.units++);
  plan.slot = &slot;
  plan.module = module.get();
  // Parameters of units nested inside this one are sharded already; a tie is sharded once.
  for (const auto& item : module->named_parameters()) {
    const c10::TensorImpl* impl = item.value().unsafeGetTensorImpl();
    if (sharding.sharded.insert(impl).second) plan.params.emplace_back(item.key(), item.value());
  }
  shard_units(state, plans, sharding.init, sharding.prepare,
              full_precision_params(*module, state.options().mixed_precision()));
}

}  // namespace fsdp::detail
