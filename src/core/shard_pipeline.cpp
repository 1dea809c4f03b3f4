#include "core/shard_pipeline.h"

#include "core/unit_slot.h"

#include <torch/csrc/autograd/grad_mode.h>

#include <sstream>

namespace fsdp::detail {

namespace {

// One model-check line: "name dtype [shape] (frozen) unit=U".
std::string describe_param(const std::string& unit, const std::string& name,
                           const at::Tensor& dtype_of, at::IntArrayRef shape, bool requires_grad) {
  std::ostringstream line;
  line << name << " " << dtype_of.dtype() << " " << shape << (requires_grad ? "" : " frozen")
       << " unit=" << (unit.empty() ? "<root>" : unit);
  return line.str();
}

// Every rank's description of the model, in plan order. Presharded units' shapes come from
// their flat parameters' entries.
ModelDescription describe(const std::vector<UnitToShard>& plans) {
  ModelDescription description;
  for (const auto& plan : plans) {
    if (plan.presharded) {
      for (const FlatEntry* entry : unit_entries(*plan.slot->unit)) {
        description.names.push_back(entry->name);
        description.lines.push_back(describe_param(plan.name, entry->name, entry->param,
                                                   entry->shape, entry->param.requires_grad()));
      }
      continue;
    }
    for (const auto& [name, p] : plan.params) {
      description.names.push_back(name);
      description.lines.push_back(describe_param(plan.name, name, p, p.sizes(), p.requires_grad()));
    }
  }
  return description;
}

void initialise(NamedTensors& params, const ParamInit& init) {
  torch::NoGradGuard no_grad;
  for (auto& [name, param] : params) init(name, param);
}

std::vector<at::Tensor> tensors_of(const NamedTensors& params) {
  std::vector<at::Tensor> tensors;
  for (const auto& item : params) tensors.push_back(item.second);
  return tensors;
}

// The parameters of the plans not sharded yet (presharded ones were checked when sharded).
NamedTensors unsharded_params(const std::vector<UnitToShard>& plans) {
  NamedTensors params;
  for (const auto& plan : plans) {
    if (!plan.presharded) params.insert(params.end(), plan.params.begin(), plan.params.end());
  }
  return params;
}

}  // namespace

void place_on_device(torch::nn::Module& module, const c10::Device& device, bool offload) {
  if (offload) {  // parameters stay in host memory, buffers go where forward runs
    for (auto& buffer : module.buffers()) buffer.set_data(buffer.to(device));
  } else {
    module.to(device);
  }
}

void shard_units(FsdpState& state, std::vector<UnitToShard>& plans, const ParamInit& init,
                 const UnitPrepare& prepare, const TensorSet& full_precision) {
  const FullyShardOptions& options = state.options();
  for (auto& plan : plans) {
    if (!plan.presharded && init) initialise(plan.params, init);
    if (!plan.presharded && prepare && plan.module) prepare(*plan.module, plan.is_root);
  }
  if (options.verify_model()) {
    check_same_model_on_all_ranks(state.world(), describe(plans));
    // sync_module_states makes them rank 0's anyway.
    if (!options.sync_module_states()) check_same_initial_values(state.world(), unsharded_params(plans));
  }
  for (auto& plan : plans) {
    if (plan.presharded) continue;
    if (options.sync_module_states()) broadcast_from_rank0(tensors_of(plan.params), state.world());
    plan.slot->unit =
        add_unit(state, plan.name, std::move(plan.params), plan.is_root, full_precision);
    plan.slot->model = &state;
  }
}

void broadcast_from_rank0(const std::vector<at::Tensor>& tensors, ProcessGroup& world) {
  torch::NoGradGuard no_grad;
  for (const auto& tensor : tensors) {
    at::Tensor contiguous = tensor.contiguous();
    broadcast(world, contiguous, /*root=*/0);
    if (!contiguous.is_same(tensor)) const_cast<at::Tensor&>(tensor).copy_(contiguous);
  }
}

}  // namespace fsdp::detail
