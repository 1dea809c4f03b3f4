#include "core/unit_groups.h"

#include "core/unit_rules.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <torch/nn/modules/batchnorm.h>

#include <algorithm>
#include <unordered_set>

namespace fsdp::detail {

namespace {

// One flat parameter of a unit: parameters that are all trainable or all frozen, and all
// computed in param_dtype or all kept in full precision.
struct GroupPlan {
  bool trainable;
  bool full_precision;
  NamedTensors params;
};

// A unit's parameters by kind (rules::group_by_kind, which the planner reads too).
std::vector<GroupPlan> split_by_kind(NamedTensors params, const TensorSet& full_precision) {
  std::vector<rules::ParamKind> kinds;
  for (const auto& item : params) {
    kinds.push_back({item.second.requires_grad(), full_precision.count(item.second.unsafeGetTensorImpl()) > 0});
  }
  std::vector<GroupPlan> plans;
  for (const auto& group : rules::group_by_kind(kinds)) {
    GroupPlan plan{kinds[group.front()].trainable, kinds[group.front()].full_precision, {}};
    for (size_t i : group) plan.params.push_back(std::move(params[i]));
    plans.push_back(std::move(plan));
  }
  return plans;
}

FlatGroup make_flat(FsdpState& state, GroupPlan plan) {
  ProcessGroup& shard_group = state.shard_group();
  const auto& policy = state.options().mixed_precision();
  const auto compute_dtype = plan.full_precision ? std::nullopt : policy.param_dtype();
  // Gradients are reduced in reduce_dtype (else the compute dtype): kept in it from the start.
  const auto grad_dtype =
      plan.full_precision ? std::nullopt
                          : policy.reduce_dtype().has_value() ? policy.reduce_dtype() : compute_dtype;
  return FlatGroup(FlatParam(std::move(plan.params), shard_group.rank(), shard_group.size(),
                             compute_dtype, state.compute_device(), grad_dtype),
                   plan.full_precision);
}

bool is_batch_norm(const torch::nn::Module& module) {
  return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&module) ||
         dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&module) ||
         dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&module);
}

// The modules mixed precision leaves in full precision: see [Note: full-precision modules].
std::vector<const torch::nn::Module*> full_precision_modules(const torch::nn::Module& root,
                                                             const MixedPrecision& policy) {
  std::vector<const torch::nn::Module*> modules;
  if (!policy.param_dtype() || !policy.keep_batch_norm_in_full_precision()) return modules;
  if (is_batch_norm(root)) modules.push_back(&root);
  for (const auto& child : root.modules(/*include_self=*/false)) {
    if (is_batch_norm(*child)) modules.push_back(child.get());
  }
  return modules;
}

}  // namespace

TensorSet full_precision_params(const torch::nn::Module& root, const MixedPrecision& policy) {
  TensorSet params;
  for (const torch::nn::Module* module : full_precision_modules(root, policy)) {
    for (const auto& p : module->parameters(/*recurse=*/false)) params.insert(p.unsafeGetTensorImpl());
  }
  return params;
}

std::shared_ptr<ParamGroup> add_unit(FsdpState& state, const std::string& name, NamedTensors params,
                                     bool is_root, const TensorSet& full_precision) {
  std::vector<GroupPlan> plans = split_by_kind(std::move(params), full_precision);
  if (plans.empty()) plans.push_back({true, false, {}});  // a unit without parameters
  std::vector<FlatGroup> flats;
  for (GroupPlan& plan : plans) flats.push_back(make_flat(state, std::move(plan)));
  auto unit = std::make_shared<ParamGroup>(name, std::move(flats), state.unit_env(), state, is_root);
  // Its name may come later (fully_shard_deferred): asked at each step.
  const FullyShardOptions& options = state.options();
  unit->install_collectives(state.unit_collectives(), [&options, self = unit.get()] {
    return !self->is_root() && options.unit_reshards_after_forward(self->name());
  });
  unit->install_grad_hooks();
  state.units().push_back(unit);
  return unit;
}

std::vector<FlatEntry*> unit_entries(ParamGroup& unit) {
  std::vector<FlatEntry*> entries;
  for (FlatGroup& g : unit.flats()) {
    for (auto& entry : g.flat.entries()) entries.push_back(&entry);
  }
  return entries;
}

void cast_floating_buffers(torch::nn::Module& root, const MixedPrecision& policy) {
  if (!policy.buffer_dtype()) return;
  torch::NoGradGuard no_grad;
  std::unordered_set<const c10::TensorImpl*> kept;
  for (const torch::nn::Module* module : full_precision_modules(root, policy)) {
    for (const auto& b : module->buffers(/*recurse=*/false)) kept.insert(b.unsafeGetTensorImpl());
  }
  for (auto& buffer : root.buffers()) {
    if (buffer.is_floating_point() && !kept.count(buffer.unsafeGetTensorImpl())) {
      buffer.set_data(buffer.to(*policy.buffer_dtype()));
    }
  }
}

}  // namespace fsdp::detail
