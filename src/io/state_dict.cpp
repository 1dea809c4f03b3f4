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

// Every expected name present with its shape, nothing else; returns the tensors by name.
std::map<std::string, at::Tensor> check_complete(const Shapes& expected, const NamedTensors& tensors,
                                                 const std::string& source) {
  std::map<std::string, at::Tensor> by_name(tensors.begin(), tensors.end());
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
    for (const auto& item : by_name) {
      TORCH_CHECK(known.count(item.first), source, " has parameter '", item.first,
                  "' that the model does not have: it was saved from another model");
    }
  }
  return by_name;
}

}  // namespace

NamedTensors gather_full_params(FsdpState& state) {
  torch::NoGradGuard no_grad;
  NamedTensors params;
  for (auto& group : state.groups()) {
    FlatParam& flat = group->flat();
    // Gathered where the collectives run (a GPU's, even when the shards are offloaded).
    const at::Tensor full = gather_flat(state, flat, flat.shard().to(state.compute_device()));
    for (const auto& e : flat.entries()) params.emplace_back(e.name, e.in_full(full).clone());
  }
  return params;
}

void save_full_params(FsdpState& state, const std::string& path) {
  NamedTensors params = gather_full_params(state);
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

void load_full_params(FsdpState& state, const NamedTensors& tensors, const std::string& source) {
  Shapes expected;
  for (auto& group : state.groups()) {
    for (const auto& e : group->flat().entries()) expected.emplace_back(e.name, e.shape);
  }
  auto by_name = check_complete(expected, tensors, source);
  torch::NoGradGuard no_grad;
  for (auto& group : state.groups()) {
    FlatParam& flat = group->flat();
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
  auto by_name = check_complete(expected, tensors, source);
  torch::NoGradGuard no_grad;
  for (auto& item : module.named_parameters()) item.value().copy_(by_name.at(item.key()));
}

}  // namespace detail
}  // namespace fsdp
