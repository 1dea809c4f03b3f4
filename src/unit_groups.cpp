#include "unit_groups.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <sstream>

namespace fsdp::detail {

namespace {

// A unit's trainable parameters, and its frozen ones (requires_grad false).
std::pair<NamedParams, NamedParams> split_frozen(NamedParams params) {
  NamedParams trainable, frozen;
  for (auto& item : params) (item.second.requires_grad() ? trainable : frozen).push_back(std::move(item));
  return {std::move(trainable), std::move(frozen)};
}

std::shared_ptr<ParamGroup> make_group(FsdpState& state, const std::string& name, NamedParams params,
                                       bool is_root) {
  ProcessGroup& shard_group = state.shard_group();
  auto group = std::make_shared<ParamGroup>(
      name,
      FlatParam(std::move(params), shard_group.rank(), shard_group.size(),
                state.options().mixed_precision().param_dtype()),
      state, is_root);
  group->install_grad_hooks();
  state.groups().push_back(group);
  return group;
}

}  // namespace

std::shared_ptr<ParamGroup> add_unit_groups(FsdpState& state, const std::string& name,
                                            NamedParams params, bool is_root) {
  auto [trainable, frozen] = split_frozen(std::move(params));
  const bool both = !trainable.empty() && !frozen.empty();
  auto group = make_group(state, name, trainable.empty() ? std::move(frozen) : std::move(trainable),
                          is_root);
  if (both) group->attach_frozen(make_group(state, name, std::move(frozen), /*is_root=*/false));
  return group;
}

std::string describe_param(const std::string& unit, const std::string& name, const at::Tensor& dtype_of,
                           at::IntArrayRef shape, bool requires_grad) {
  std::ostringstream line;
  line << name << " " << dtype_of.dtype() << " " << shape << (requires_grad ? "" : " frozen")
       << " unit=" << (unit.empty() ? "<root>" : unit);
  return line.str();
}

void add_description(ModelDescription& description, const std::string& unit, const NamedParams& params) {
  for (const auto& [name, p] : params) {
    description.names.push_back(name);
    description.lines.push_back(describe_param(unit, name, p, p.sizes(), p.requires_grad()));
  }
}

std::vector<at::Tensor> tensors_of(const NamedParams& params) {
  std::vector<at::Tensor> tensors;
  for (const auto& item : params) tensors.push_back(item.second);
  return tensors;
}

void initialise(NamedParams& params, const ParamInit& init) {
  torch::NoGradGuard no_grad;
  for (auto& [name, param] : params) init(name, param);
}

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

}  // namespace fsdp::detail
