#include <fsdp/state_dict.h>

#include <fsdp/error_text.h>

#include "core/model_collectives.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <map>

namespace fsdp {
namespace detail {

namespace {

using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

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
std::map<std::string, at::Tensor> check_complete(const Shapes& expected, const NamedTensors& buffers,
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

NamedTensors gather_full_params(FsdpState& state, const NamedTensors& buffers) {
  torch::NoGradGuard no_grad;
  NamedTensors params;
  for (FlatParam* flat_param : state.flat_params()) {
    FlatParam& flat = *flat_param;
    // Gathered where the collectives run (a GPU's, even when the shards are offloaded).
    const at::Tensor full = gather_flat(state, flat, flat.shard().to(state.compute_device()));
    for (const auto& e : flat.entries()) params.emplace_back(e.name, e.in_full(full).clone());
  }
  // Rank 0's buffers, as sync_buffers gives every rank (each rank's own running statistics
  // drift apart under BatchNorm), over the world process group, in host memory.
  for (const auto& [name, buffer] : buffers) {
    at::Tensor value = buffer.detach().to(at::kCPU).clone();
    broadcast(state.world(), value, /*root=*/0);
    params.emplace_back(name, value.to(buffer.device()));
  }
  return params;
}

void save_full_params(FsdpState& state, const NamedTensors& buffers, const std::string& path) {
  NamedTensors params = gather_full_params(state, buffers);
  std::string error;
  if (state.world().rank() == 0) {
    try {
      save_tensor_dict(path, params);
    } catch (const std::exception& e) {
      error = message_of(e);
    }
  }
  // Everyone learns whether rank 0 succeeded, instead of some ranks going on alone: agreement
  // over the world process group itself, outside the model's collectives.
  auto failed = at::full({1}, error.empty() ? 0.0f : 1.0f);
  all_reduce_sum(state.world(), failed);
  TORCH_CHECK(failed.item<float>() == 0.0f, "save_full_params: rank 0 could not write ", path,
              error.empty() ? "" : ": " + error);
}

void load_full_params(FsdpState& state, const NamedTensors& buffers, const NamedTensors& tensors,
                      const std::string& source) {
  Shapes expected;
  for (FlatParam* flat : state.flat_params()) {
    for (const auto& e : flat->entries()) expected.emplace_back(e.name, e.shape);
  }
  auto by_name = check_complete(expected, buffers, tensors, source);
  for (auto& group : state.units()) {
    // Into the shards the next forward gathers: not behind a unit a forward left unsharded.
    TORCH_CHECK(group->reshard_unless_in_backward(), "load_full_params: unit '", group->name(),
                "' is in its backward: load between steps");  // [Note: resharding between steps]
  }
  torch::NoGradGuard no_grad;
  copy_buffers(buffers, by_name);
  for (FlatParam* flat_param : state.flat_params()) {
    FlatParam& flat = *flat_param;
    for (const auto& e : flat.entries()) {
      if (!e.outside_shard()) e.in_shard(flat.shard()).copy_(flat.local_piece(e, by_name.at(e.name)));
    }
  }
}

void load_full_params(torch::nn::Module& module, const NamedTensors& tensors,
                      const std::string& source) {
  Shapes expected;
  for (const auto& item : module.named_parameters()) {
    expected.emplace_back(item.key(), item.value().sizes().vec());
  }
  const NamedTensors buffers = module_buffers(module);
  auto by_name = check_complete(expected, buffers, tensors, source);
  torch::NoGradGuard no_grad;
  for (auto& item : module.named_parameters()) item.value().copy_(by_name.at(item.key()));
  copy_buffers(buffers, by_name);
}

}  // namespace detail
}  // namespace fsdp
