// fully_shard(): find the units of a model, check the ranks agree on it, build one FlatParam per
// unit (the root takes every parameter outside all units), and connect the Unit holders.
#include <fsdp/fully_shard.h>

#include "core/fsdp_state.h"
#include "core/shard_pipeline.h"
#include "core/sharded_model.h"
#include "core/sharded_view.h"
#include "core/unit_slot.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>

namespace fsdp {

namespace detail {

namespace {

// [Note: the unit registry]
// Which modules are held by a Unit, keyed by the module's address; a slot expires with its Unit
// holder. It is process-wide state on purpose: a torch::nn::Module has no place for our data and
// a Unit holder is built inside the user's constructor, before any model or process group
// exists, so fully_shard can only learn that a module it walks is a unit by looking it up here.
// Nothing else is kept globally: everything a unit needs at run time hangs off its slot.
struct UnitRegistry {
  std::mutex mutex;
  std::unordered_map<const torch::nn::Module*, std::weak_ptr<UnitSlot>> slots;
};

UnitRegistry& registry() {
  static UnitRegistry instance;
  return instance;
}

// The innermost unit whose module path is a prefix of the parameter's name ("" for the root).
const std::string& unit_holding(const std::vector<UnitToShard>& plans, const std::string& param) {
  const std::string* best = &plans[0].name;
  for (const auto& plan : plans) {
    const bool inside = !plan.name.empty() && param.size() > plan.name.size() &&
                        param.compare(0, plan.name.size(), plan.name) == 0 &&
                        param[plan.name.size()] == '.';
    if (inside && plan.name.size() > best->size()) best = &plan.name;
  }
  return *best;
}

// Assigns every parameter to the innermost unit that holds it, the root taking the rest.
// named_modules() lists parents before children, so an inner unit overrides its parent.
std::vector<UnitToShard> plans_of(const std::shared_ptr<torch::nn::Module>& root,
                               const FsdpState* deferred) {
  std::vector<UnitToShard> plans(1);  // plans[0]: the root
  std::unordered_map<const c10::TensorImpl*, size_t> owner;
  for (const auto& item : root->named_modules("", /*include_self=*/false)) {
    auto slot = find_unit(item.value().get());
    if (!slot) continue;
    const bool presharded = slot->unit && deferred && slot->model == deferred;
    TORCH_CHECK(!slot->unit || presharded, "fully_shard: module '", item.key(),
                "' is already a unit of another sharded model");
    plans.push_back(UnitToShard{item.key(), slot.get(), {}, presharded, false, item.value().get()});
    for (const auto& p : item.value()->parameters()) owner[p.unsafeGetTensorImpl()] = plans.size() - 1;
  }
  // A parameter registered under two names (tied weights) is sharded once, under its first
  // name; ties across units cannot be: each unit gathers and frees its own flat buffer.
  std::unordered_map<const c10::TensorImpl*, std::string> first_name;
  for (const auto& item : root->named_parameters()) {
    const c10::TensorImpl* impl = item.value().unsafeGetTensorImpl();
    auto [first, inserted] = first_name.emplace(impl, item.key());
    if (!inserted) {
      const std::string& unit_a = unit_holding(plans, first->second);
      const std::string& unit_b = unit_holding(plans, item.key());
      TORCH_CHECK(unit_a == unit_b, "fully_shard: parameters '", first->second, "' (unit '",
                  unit_a.empty() ? "<root>" : unit_a, "') and '", item.key(), "' (unit '",
                  unit_b.empty() ? "<root>" : unit_b, "') are the same tensor (tied), but sit in "
                  "different units, which gather and free their parameters separately. Put both "
                  "modules in one unit (wrap their common parent, or leave them to the root), or "
                  "tie them in forward (e.g. F::linear(x, wte->weight)) instead of registering "
                  "the tensor twice.");
      continue;
    }
    auto it = owner.find(impl);
    plans[it == owner.end() ? 0 : it->second].params.emplace_back(item.key(), item.value());
  }
  return plans;
}

// A deferred unit was sharded before its place in the model was known: give it its path.
void name_presharded_unit(const UnitToShard& plan) {
  std::unordered_map<const c10::TensorImpl*, std::string> full_names;
  for (const auto& [name, p] : plan.params) full_names.emplace(p.unsafeGetTensorImpl(), name);
  for (FlatEntry* entry : unit_entries(*plan.slot->unit)) {
    entry->name = full_names.at(entry->param.unsafeGetTensorImpl());
  }
  plan.slot->unit->set_name(plan.name);
}

// The device the model computes on: options.device(), else its parameters' (all on one device),
// else CPU. A deferred model's is its state's.
c10::Device compute_device(torch::nn::Module& root, const FullyShardOptions& options,
                           const FsdpState* deferred) {
  if (deferred) return deferred->compute_device();
  if (options.device()) return *options.device();
  std::optional<c10::Device> device;
  std::string first;
  for (const auto& item : root.named_parameters()) {
    if (!device) {
      device = item.value().device();
      first = item.key();
    }
    TORCH_CHECK(item.value().device() == *device, "fully_shard: parameter '", item.key(), "' is on ",
                item.value().device().str(), " but '", first, "' on ", device->str(),
                ": move the model to one device (or pass FullyShardOptions::device)");
  }
  return device.value_or(c10::Device(c10::kCPU));
}

// units[0] must be the root: moves it before the units sharded earlier.
void put_root_first(FsdpState& state, size_t units_before) {
  auto& units = state.units();
  std::rotate(units.begin(), units.begin() + units_before, units.end());
}

// Every unit built inside a deferred factory is a unit of the model.
void check_presharded_claimed(const std::vector<UnitToShard>& plans, size_t presharded_units) {
  const auto claimed = static_cast<size_t>(
      std::count_if(plans.begin(), plans.end(), [](const UnitToShard& plan) { return plan.presharded; }));
  TORCH_CHECK(claimed == presharded_units, "fully_shard_deferred: ", presharded_units - claimed,
              " unit(s) built inside the factory are not part of the model it returned; construct "
              "fsdp::Unit holders only for modules the model registers");
}

}  // namespace

std::shared_ptr<UnitSlot> find_unit(const torch::nn::Module* module) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  auto it = registry().slots.find(module);
  return it == registry().slots.end() ? nullptr : it->second.lock();
}

std::vector<ShardedModel> sharded_models() {
  std::lock_guard<std::mutex> lock(registry().mutex);
  std::vector<ShardedModel> models;
  for (const auto& [module, weak] : registry().slots) {
    if (auto slot = weak.lock(); slot && slot->sharded_model) models.push_back(*slot->sharded_model);
  }
  return models;
}

bool is_sharded(const UnitSlot* slot) { return slot && slot->unit; }

ShardedModel* root_of(UnitSlot* slot) {
  return slot && slot->sharded_model ? &*slot->sharded_model : nullptr;
}

ShardedModel& sharded_root_of(UnitSlot* slot) {
  ShardedModel* model = root_of(slot);
  TORCH_CHECK(model, "the model is not sharded (call fully_shard first)");
  return *model;
}

std::shared_ptr<UnitSlot> register_unit(const torch::nn::Module* module) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  for (auto it = registry().slots.begin(); it != registry().slots.end();) {
    it = it->second.expired() ? registry().slots.erase(it) : std::next(it);
  }
  // Another holder of the same module (register_module's result, a copy) is the same unit.
  if (auto it = registry().slots.find(module); it != registry().slots.end()) return it->second.lock();
  auto slot = std::make_shared<UnitSlot>();
  registry().slots[module] = slot;
  return slot;
}

// The pipeline of [Note: one sharding pipeline] for the whole model: every unit at once, or, after
// fully_shard_deferred, the root (its units are presharded).
void shard_model(const std::shared_ptr<torch::nn::Module>& root, ProcessGroup& group,
                 const FullyShardOptions& options, const DeferredScope* deferred_scope) {
  options.validate(group.size(), group.settings().local_world_size);
  const std::shared_ptr<UnitSlot> root_slot = find_unit(root.get());
  TORCH_CHECK(root_slot, "fully_shard: the model is empty");
  TORCH_CHECK(!root_slot->unit, "fully_shard: this model is already sharded");
  const std::shared_ptr<FsdpState> deferred = deferred_scope ? deferred_scope->sharding().state : nullptr;
  const c10::Device device = compute_device(*root, options, deferred.get());
  place_on_device(*root, device, options.cpu_offload());
  std::vector<UnitToShard> plans = plans_of(root, deferred.get());
  plans[0].slot = root_slot.get();
  plans[0].is_root = true;
  plans[0].module = root.get();
  for (auto& plan : plans) {
    if (plan.presharded) name_presharded_unit(plan);
  }
  auto state = deferred ? deferred : std::make_shared<FsdpState>(group, options, device);
  const size_t presharded_units = state->units().size();
  const ParamInit no_init;
  const UnitPrepare no_prepare;
  shard_units(*state, plans, deferred_scope ? deferred_scope->sharding().init : no_init,
              deferred_scope ? deferred_scope->sharding().prepare : no_prepare,
              full_precision_params(*root, options.mixed_precision()));
  put_root_first(*state, presharded_units);
  check_presharded_claimed(plans, presharded_units);
  if (options.sync_buffers()) broadcast_from_rank0(root->buffers(), group);
  cast_floating_buffers(*root, options.mixed_precision());
  root_slot->sharded_model.emplace(std::make_shared<ShardedModel::Impl>(ShardedModel::Impl{state, root}));
}

const std::string& unit_name(const UnitSlot& slot) { return slot.unit->name(); }

std::optional<c10::ScalarType> input_dtype(const UnitSlot& slot) {
  return slot.model->options().mixed_precision().param_dtype();
}

bool holds_full_params(const UnitSlot& slot) { return slot.model->full_params_held(); }

bool checkpoints_activations(const UnitSlot& slot) {
  return slot.model->options().activation_checkpointing() && !slot.unit->is_root();
}

void pre_forward(UnitSlot& slot) { slot.model->pre_forward(*slot.unit); }

void post_forward(UnitSlot& slot, const std::vector<at::Tensor>& inputs,
                  const std::vector<at::Tensor>& outputs, bool training) {
  slot.model->post_forward(*slot.unit, inputs, outputs, training);
}

}  // namespace detail

NoSyncGuard::NoSyncGuard(const ShardedModel& model) : model_(model) { engine_of(model_).set_no_sync(true); }

NoSyncGuard::~NoSyncGuard() { engine_of(model_).set_no_sync(false); }

}  // namespace fsdp
