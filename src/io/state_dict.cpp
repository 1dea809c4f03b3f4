#include <fsdp/state_dict.h>

#include <fsdp/parallelize.h>

#include <fsdp/param_loader.h>

#include "io/checkpoint_agreement.h"
#include "io/tp_replica_check.h"
#include "core/sharded_view.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <map>

namespace fsdp {
namespace detail {

namespace {

// The buffers that `by_name` holds must have their shapes.
void check_buffer_shapes(const NamedTensors& buffers, const std::map<std::string, at::Tensor>& by_name,
                         const std::string& source) {
  for (const auto& [name, buffer] : buffers) {
    auto it = by_name.find(name);
    TORCH_CHECK(it == by_name.end() || it->second.sizes() == buffer.sizes(), source, ": buffer '",
                name, "' has shape ", it->second.sizes(), " but the model's is ", buffer.sizes(),
                ": it was saved from another model configuration");
  }
}

// Every expected name present with its shape, buffers (optional) with theirs, nothing else;
// returns the tensors by name.
std::map<std::string, at::Tensor> check_complete(const ParamShapes& expected, const NamedTensors& buffers,
                                                 const NamedTensors& tensors,
                                                 const std::string& source) {
  std::map<std::string, at::Tensor> by_name(tensors.begin(), tensors.end());
  check_buffer_shapes(buffers, by_name, source);
  for (const auto& [name, shape] : expected) {
    auto it = by_name.find(name);
    TORCH_CHECK(it != by_name.end(), source, " has no parameter '", name,
                "': it was saved from another model");
    TORCH_CHECK(it->second.sizes().vec() == shape, source, ": parameter '", name, "' has shape ",
                it->second.sizes(), " but the model's is ", c10::IntArrayRef(shape));
    TORCH_CHECK(it->second.is_floating_point(), source, ": parameter '", name, "' is ",
                it->second.dtype(), ", not a floating-point tensor");
  }
  if (by_name.size() != expected.size()) {
    std::map<std::string, bool> known;
    for (const auto& item : expected) known[item.first] = true;
    for (const auto& item : buffers) known[item.first] = true;
    for (const auto& item : by_name) {
      TORCH_CHECK(known.count(item.first), source, " has parameter '", item.first,
                  "' that the model does not have: it was saved from another model");
    }
  }
  return by_name;
}

// The model's buffers take the values in `by_name` (those it holds).
void copy_buffers(const NamedTensors& buffers, const std::map<std::string, at::Tensor>& by_name) {
  for (const auto& [name, buffer] : buffers) {
    if (auto it = by_name.find(name); it != by_name.end()) buffer.copy_(it->second);
  }
}

}  // namespace

NamedTensors module_buffers(torch::nn::Module& module) {
  NamedTensors buffers;
  for (const auto& item : module.named_buffers()) buffers.emplace_back(item.key(), item.value());
  return buffers;
}

void load_full_params(torch::nn::Module& module, const NamedTensors& tensors,
                      const std::string& source) {
  const NamedTensors buffers = module_buffers(module);
  auto by_name = check_complete(param_shapes(module), buffers, tensors, source);
  torch::NoGradGuard no_grad;
  for (auto& item : module.named_parameters()) item.value().copy_(by_name.at(item.key()));
  copy_buffers(buffers, by_name);
}

}  // namespace detail

namespace {

// Under tensor parallelism, FSDP's whole parameter is this rank's part: the parts made whole.
at::Tensor whole_over_tensor_parallel(const detail::ShardedParam& param, at::Tensor gathered) {
  const auto& placement = param.tensor_parallel();
  return placement ? tp::whole_of(gathered, *placement) : gathered;
}

// Whether this rank writes what every rank gathered: one rank per tensor-parallel group.
bool first_tensor_parallel_rank(const detail::ShardedView& model) {
  for (const auto& p : model.params()) {
    if (const auto& placement = p.tensor_parallel()) return placement->tp->rank() == 0;
  }
  return true;
}

}  // namespace

NamedTensors gather_full_params(const ShardedModel& sharded) {
  torch::NoGradGuard no_grad;
  const detail::ShardedView model(sharded);
  const NamedTensors buffers = detail::module_buffers(sharded.module());
  // A full state keeps tp rank 0's replicated parameters: say so if the others' differ.
  detail::warn_if_replicas_drifted(model, "the full state dict");
  NamedTensors params;
  for (const auto& buffer : model.buffers()) {
    // Gathered where the collectives run (a GPU's, even when the shards are offloaded).
    const at::Tensor full = buffer.gather_whole(buffer.shard().to(model.compute_device()));
    for (const auto& p : buffer.params()) {
      params.emplace_back(p.name(), whole_over_tensor_parallel(p, p.in_whole(full).clone()));
    }
  }
  // Rank 0's buffers, as sync_buffers gives every rank (each rank's own running statistics
  // drift apart under BatchNorm), over the world process group, in host memory.
  for (const auto& [name, buffer] : buffers) {
    at::Tensor value = buffer.detach().to(at::kCPU).clone();
    broadcast(model.world(), value, /*root=*/0);
    params.emplace_back(name, value.to(buffer.device()));
  }
  return params;
}

void save_full_params(const ShardedModel& model, const std::string& path) {
  NamedTensors params = gather_full_params(model);
  ProcessGroup& world = detail::ShardedView(model).world();
  // Everyone learns whether rank 0 succeeded, instead of some ranks going on alone
  // ([Note: checkpoint agreement]).
  const std::string error = detail::try_local([&] {
    if (world.rank() == 0 && first_tensor_parallel_rank(detail::ShardedView(model))) save_tensor_dict(path, params);
  });
  detail::throw_if_any_failed(world, error, "save_full_params: cannot write " + path);
}

void load_full_params(const ShardedModel& sharded, const NamedTensors& tensors, const std::string& source) {
  const detail::ShardedView model(sharded);
  const NamedTensors buffers = detail::module_buffers(sharded.module());
  auto by_name = detail::check_complete(param_shapes(sharded), buffers, tensors, source);
  for (const auto& buffer : model.buffers()) {
    // Into the shards the next forward gathers: not behind a unit a forward left unsharded.
    TORCH_CHECK(buffer.reshard_unless_in_backward(), "load_full_params: unit '", buffer.unit_name(),
                "' is in its backward: load between steps");  // [Note: resharding between steps]
  }
  torch::NoGradGuard no_grad;
  detail::copy_buffers(buffers, by_name);
  for (const auto& p : model.params()) {
    if (!p.empty()) p.data().copy_(p.piece_of(by_name.at(p.name())));
  }
}

}  // namespace fsdp
