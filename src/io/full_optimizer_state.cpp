// gather_full_optimizer_state (include/fsdp/checkpoint.h): every parameter's AdamW moments,
// gathered unit by unit from the shards like the parameters themselves.
#include <fsdp/checkpoint.h>

#include "io/adamw_state.h"
#include "io/checkpoint_format.h"
#include "core/model_collectives.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace fsdp::detail {

namespace {

// The moments of `kind` of `flat`'s parameters, laid out like its shard (zeros where a
// parameter has none), on the collectives' device (a GPU's, also when the shards are offloaded).
at::Tensor moment_shard(FsdpState& state, torch::optim::AdamW& optimizer, FlatParam& flat,
                        const char* kind) {
  const auto options = flat.shard().options().device(state.compute_device()).pinned_memory(false);
  at::Tensor shard = at::zeros({flat.shard_numel()}, options);
  for (auto& e : flat.entries()) {
    const auto* adam = adamw_state(optimizer, e.param);
    if (adam && moment(*adam, kind).defined() && !e.outside_shard()) {
      e.in_shard(shard).copy_(moment(*adam, kind).reshape({-1}));
    }
  }
  return shard;
}

}  // namespace

NamedTensors gather_full_optimizer_state(FsdpState& state, torch::optim::AdamW& optimizer) {
  torch::NoGradGuard no_grad;
  const bool amsgrad = any_amsgrad(optimizer);  // the same on every rank: the same collectives
  NamedTensors out;
  for (auto& group : state.groups()) {
    FlatParam& flat = group->flat();
    for (const char* kind : kMomentKinds) {
      if (std::string(kind) == "max_exp_avg_sq" && !amsgrad) continue;
      const at::Tensor full = gather_flat(state, flat, moment_shard(state, optimizer, flat, kind));
      for (auto& e : flat.entries()) {
        const auto* adam = adamw_state(optimizer, e.param);
        if (!adam || !moment(*adam, kind).defined()) continue;
        out.emplace_back(tensor_key(kind, e.name), e.in_full(full).clone());
      }
    }
    for (auto& e : flat.entries()) {
      if (const auto* adam = adamw_state(optimizer, e.param)) {
        out.emplace_back(tensor_key("step", e.name), at::scalar_tensor(adam->step(), at::kLong));
      }
    }
  }
  return out;
}

}  // namespace fsdp::detail
