// gather_full_optimizer_state (include/fsdp/checkpoint.h): every parameter's optimizer state
// tensors, gathered unit by unit from the shards like the parameters themselves.
#include <fsdp/checkpoint.h>

#include "io/checkpoint_format.h"
#include "io/optimizer_state.h"
#include "core/model_collectives.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace fsdp::detail {

namespace {

// The state tensors of `kind` of `flat`'s parameters, laid out like its shard (zeros where a
// parameter has none), on the collectives' device (a GPU's, also when the shards are offloaded).
at::Tensor state_shard(FsdpState& state, const OptimizerState& optimizer, FlatParam& flat,
                       const std::string& kind) {
  const auto options = flat.shard().options().device(state.compute_device()).pinned_memory(false);
  at::Tensor shard = at::zeros({flat.shard_numel()}, options);
  for (auto& e : flat.entries()) {
    const auto saved = optimizer.read(e.param);
    if (saved && saved->tensors.count(kind) && !e.outside_shard()) {
      e.in_shard(shard).copy_(saved->tensors.at(kind).reshape({-1}));
    }
  }
  return shard;
}

}  // namespace

NamedTensors gather_full_optimizer_state(FsdpState& state, torch::optim::Optimizer& optimizer_in) {
  torch::NoGradGuard no_grad;
  const OptimizerState optimizer(optimizer_in, "gather_full_optimizer_state");
  // The same kinds on every rank: the same collectives.
  const std::vector<std::string> kinds = optimizer.kinds_in_use();
  NamedTensors out;
  for (FlatParam* flat_param : state.flat_params()) {
    FlatParam& flat = *flat_param;
    for (const auto& kind : kinds) {
      const at::Tensor full = gather_flat(state, flat, state_shard(state, optimizer, flat, kind));
      for (auto& e : flat.entries()) {
        const auto saved = optimizer.read(e.param);
        if (!saved || !saved->tensors.count(kind)) continue;
        out.emplace_back(tensor_key(kind, e.name), e.in_full(full).clone());
      }
    }
    for (auto& e : flat.entries()) {
      const auto saved = optimizer.read(e.param);
      if (saved && saved->step) {
        out.emplace_back(tensor_key("step", e.name), at::scalar_tensor(*saved->step, at::kLong));
      }
    }
  }
  return out;
}

}  // namespace fsdp::detail
