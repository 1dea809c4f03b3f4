// fully_shard(): find the units of a model, check the ranks agree on it, build one FlatParam per
// unit (the root takes every parameter outside all units), and connect the Unit holders.
#include <fsdp/fully_shard.h>

#include "fsdp_state.h"
#include "model_check.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>

namespace fsdp {

namespace detail {

namespace {

// Which modules are held by a Unit. Keyed by address; a slot expires with its Unit holder.
struct UnitRegistry {
  std::mutex mutex;
  std::unordered_map<const torch::nn::Module*, std::weak_ptr<UnitSlot>> slots;
};

UnitRegistry& registry() {
  static UnitRegistry instance;
  return instance;
}

std::shared_ptr<UnitSlot> find_unit(const torch::nn::Module* module) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  auto it = registry().slots.find(module);
  return it == registry().slots.end() ? nullptr : it->second.lock();
}

using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;

struct UnitPlan {
  std::string name;                  // module path; "" for the root
  std::shared_ptr<UnitSlot> slot;
  NamedParams params;
};

// The innermost unit whose module path is a prefix of the parameter's name ("" for the root).
const std::string& unit_holding(const std::vector<UnitPlan>& plans, const std::string& param) {
  const std::string* best = &plans[0].name;
  for (const auto& plan : plans) {
    const bool inside = !plan.name.empty() && param.size() > plan.name.size() &&
                        param.compare(0, plan.name.size(), plan.name) == 0 &&
                        param[plan.name.size()] == '.';
    if (inside && plan.name.size() > best->size()) best = &plan.name;
  }
  return *best;
}

// A unit's trainable parameters, and its frozen ones (requires_grad false).
std::pair<NamedParams, NamedParams> split_frozen(NamedParams params) {
  NamedParams trainable, frozen;
  for (auto& item : params) (item.second.requires_grad() ? trainable : frozen).push_back(std::move(item));
  return {std::move(trainable), std::move(frozen)};
}

// Assigns every parameter to the innermost unit that holds it, the root taking the rest.
// named_modules() lists parents before children, so an inner unit overrides its parent.
std::vector<UnitPlan> plan_units(const std::shared_ptr<torch::nn::Module>& root) {
  std::vector<UnitPlan> plans(1);  // plans[0]: the root
  std::unordered_map<const c10::TensorImpl*, size_t> owner;
  for (const auto& item : root->named_modules("", /*include_self=*/false)) {
    auto slot = find_unit(item.value().get());
    if (!slot) continue;
    TORCH_CHECK(!slot->group, "fully_shard: module '", item.key(),
                "' is already a unit of another sharded model");
    plans.push_back(UnitPlan{item.key(), slot, {}});
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

std::string describe(const std::string& unit, const std::string& name, const at::Tensor& p) {
  std::ostringstream line;
  line << name << " " << p.dtype() << " " << p.sizes() << (p.requires_grad() ? "" : " frozen")
       << " unit=" << (unit.empty() ? "<root>" : unit);
  return line.str();
}

ModelDescription describe(const std::vector<UnitPlan>& plans) {
  ModelDescription description;
  for (const auto& plan : plans) {
    for (const auto& [name, p] : plan.params) {
      description.names.push_back(name);
      description.lines.push_back(describe(plan.name, name, p));
    }
  }
  return description;
}

// Makes every rank's tensors equal to rank 0's.
void broadcast_from_rank0(const std::vector<at::Tensor>& tensors, ProcessGroup& world) {
  torch::NoGradGuard no_grad;
  for (const auto& tensor : tensors) {
    at::Tensor contiguous = tensor.contiguous();
    broadcast(world, contiguous, /*root=*/0);
    if (!contiguous.is_same(tensor)) const_cast<at::Tensor&>(tensor).copy_(contiguous);
  }
}

void cast_floating_buffers(torch::nn::Module& root, c10::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  for (auto& buffer : root.buffers()) {
    if (buffer.is_floating_point()) buffer.set_data(buffer.to(dtype));
  }
}

}  // namespace

std::shared_ptr<UnitSlot> register_unit(const torch::nn::Module* module) {
  auto slot = std::make_shared<UnitSlot>();
  std::lock_guard<std::mutex> lock(registry().mutex);
  for (auto it = registry().slots.begin(); it != registry().slots.end();) {
    it = it->second.expired() ? registry().slots.erase(it) : std::next(it);
  }
  registry().slots[module] = slot;
  return slot;
}

std::shared_ptr<FsdpState> shard_model(const std::shared_ptr<torch::nn::Module>& root,
                                       UnitSlot& root_slot, ProcessGroup& group,
                                       const FullyShardOptions& options) {
  options.validate(group.size());
  TORCH_CHECK(!root_slot.group, "fully_shard: this model is already sharded");
  std::vector<UnitPlan> plans = plan_units(root);
  if (options.verify_model()) check_same_model_on_all_ranks(group, describe(plans));

  auto state = std::make_shared<FsdpState>(group, options);
  if (options.sync_buffers()) broadcast_from_rank0(root->buffers(), group);
  if (options.sync_module_states()) broadcast_from_rank0(root->parameters(), group);
  if (auto dtype = options.mixed_precision().buffer_dtype()) cast_floating_buffers(*root, *dtype);
  ProcessGroup& shard_group = state->shard_group();
  auto make_group = [&](const std::string& name, NamedParams params, bool is_root) {
    auto group = std::make_shared<ParamGroup>(
        name,
        FlatParam(std::move(params), shard_group.rank(), shard_group.size(),
                  options.mixed_precision().param_dtype()),
        *state, is_root);
    group->install_grad_hooks();
    state->groups().push_back(group);
    return group;
  };
  for (size_t i = 0; i < plans.size(); ++i) {
    const bool is_root = i == 0;
    auto [trainable, frozen] = split_frozen(std::move(plans[i].params));
    const bool both = !trainable.empty() && !frozen.empty();
    auto group = make_group(plans[i].name, trainable.empty() ? std::move(frozen) : std::move(trainable),
                            is_root);
    if (both) group->attach_frozen(make_group(plans[i].name, std::move(frozen), /*is_root=*/false));
    (is_root ? root_slot : *plans[i].slot).group = group;
  }
  return state;
}

std::vector<UnitInfo> unit_infos(const FsdpState& state) {
  std::vector<UnitInfo> infos;
  for (const auto& group : state.groups()) infos.push_back(group->info());
  return infos;
}

void set_no_sync(FsdpState& state, bool no_sync) { state.set_no_sync(no_sync); }

const std::string& unit_name(const ParamGroup& group) { return group.name(); }

std::optional<c10::ScalarType> input_dtype(const ParamGroup& group) {
  return group.state().options().mixed_precision().param_dtype();
}

bool checkpoints_activations(const ParamGroup& group) {
  return group.state().options().activation_checkpointing() && !group.is_root();
}

void pre_forward(ParamGroup& group) { group.pre_forward(); }

void post_forward(ParamGroup& group, const std::vector<at::Tensor>& inputs,
                  const std::vector<at::Tensor>& outputs) {
  group.post_forward(inputs, outputs);
}

}  // namespace detail

}  // namespace fsdp
