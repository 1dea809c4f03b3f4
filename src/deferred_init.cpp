// Deferred initialisation (paper, section 3.1): while a fully_shard_deferred factory runs, every
// fsdp::Unit holder it constructs shards its module at once, so the whole model never exists on
// one rank. The units get their module paths, and the root its own flat parameter, when the
// factory has returned (shard_model).
#include <fsdp/fully_shard.h>

#include "unit_groups.h"

#include <c10/util/Exception.h>

#include <unordered_set>

namespace fsdp::detail {

struct DeferredSharding {
  std::shared_ptr<FsdpState> state;
  ParamInit init;
  std::unordered_set<const c10::TensorImpl*> sharded;  // parameters already in some unit's shard
  int units = 0;
};

namespace {
thread_local DeferredSharding* active = nullptr;
}  // namespace

DeferredScope::DeferredScope(ProcessGroup& group, const FullyShardOptions& options, ParamInit init)
    : sharding_(std::make_unique<DeferredSharding>()) {
  options.validate(group.size());
  TORCH_CHECK(!active, "fully_shard_deferred: its factory built another deferred model");
  sharding_->state =
      std::make_shared<FsdpState>(group, options, options.device().value_or(c10::Device(c10::kCPU)));
  sharding_->init = std::move(init);
  active = sharding_.get();
}

DeferredScope::~DeferredScope() { close(); }

void DeferredScope::close() {
  if (active == sharding_.get()) active = nullptr;
}

std::shared_ptr<FsdpState> DeferredScope::state() const { return sharding_->state; }
const ParamInit& DeferredScope::init() const { return sharding_->init; }

void shard_if_deferred(UnitSlot& slot, const std::shared_ptr<torch::nn::Module>& module) {
  if (!active || slot.group) return;
  DeferredSharding& sharding = *active;
  FsdpState& state = *sharding.state;
  // Built where the factory runs, sharded where the model computes (offloaded: the parameters
  // stay in host memory, the buffers go where forward runs).
  if (state.options().cpu_offload()) {
    for (auto& buffer : module->buffers()) buffer.set_data(buffer.to(state.compute_device()));
  } else if (!state.compute_device().is_cpu()) {
    module->to(state.compute_device());
  }
  // Parameters of units nested inside this one are sharded already; a tie is sharded once.
  NamedParams params;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : module->named_parameters()) {
    const c10::TensorImpl* impl = item.value().unsafeGetTensorImpl();
    if (sharding.sharded.count(impl) || !seen.insert(impl).second) continue;
    params.emplace_back(item.key(), item.value());
  }
  if (sharding.init) initialise(params, sharding.init);
  const std::string label = "deferred unit #" + std::to_string(sharding.units++);
  // Checked unit by unit, before any collective touches the unit (the sync below, the shards).
  if (state.options().verify_model()) {
    ModelDescription description;
    add_description(description, label, params);
    check_same_model_on_all_ranks(state.world(), description);
  }
  if (state.options().sync_module_states()) broadcast_from_rank0(tensors_of(params), state.world());
  for (const auto& item : params) sharding.sharded.insert(item.second.unsafeGetTensorImpl());
  slot.group = add_unit_groups(state, label, std::move(params), /*is_root=*/false,
                               full_precision_params(*module, state.options().mixed_precision()));
}

}  // namespace fsdp::detail
