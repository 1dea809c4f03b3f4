// gather_full_optimizer_state (include/fsdp/checkpoint.h): every parameter's optimizer state
// tensors, gathered unit by unit from the shards like the parameters themselves.
#include <fsdp/checkpoint.h>
#include <fsdp/parallelize.h>

#include "io/checkpoint_format.h"
#include "io/optimizer_set.h"
#include "core/sharded_view.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace fsdp::detail {

namespace {

// The state tensors of `kind` of `buffer`'s parameters, laid out like its shard (zeros where a
// parameter has none), on the collectives' device (a GPU's, also when the shards are offloaded).
at::Tensor state_shard(const ShardedView& model, const OptimizerSet& optimizers,
                       const ShardedBuffer& buffer, const std::string& kind) {
  const auto options = buffer.shard().options().device(model.compute_device()).pinned_memory(false);
  at::Tensor shard = at::zeros({buffer.shard().numel()}, options);
  for (const auto& p : buffer.params()) {
    const auto saved = optimizers.read(p.param());
    if (saved && saved->tensors.count(kind) && !p.empty()) {
      p.in_shard(shard).copy_(saved->tensors.at(kind).reshape({-1}));
    }
  }
  return shard;
}

}  // namespace

}  // namespace fsdp

namespace fsdp {

NamedTensors gather_full_optimizer_state(const ShardedModel& sharded, torch::optim::Optimizer& optimizer) {
  return gather_full_optimizer_state(sharded, std::vector<torch::optim::Optimizer*>{&optimizer});
}

NamedTensors gather_full_optimizer_state(const ShardedModel& sharded,
                                         const std::vector<torch::optim::Optimizer*>& optimizers_in) {
  using namespace detail;
  torch::NoGradGuard no_grad;
  const ShardedView model(sharded);
  const OptimizerSet optimizers(optimizers_in, model, "gather_full_optimizer_state");
  // The same kinds on every rank: the same collectives.
  const std::vector<std::string> kinds = optimizers.kinds_in_use();
  NamedTensors out;
  for (const auto& buffer : model.buffers()) {
    for (const auto& kind : kinds) {
      const at::Tensor full = buffer.gather_whole(state_shard(model, optimizers, buffer, kind));
      for (const auto& p : buffer.params()) {
        const auto saved = optimizers.read(p.param());
        if (!saved || !saved->tensors.count(kind)) continue;
        at::Tensor whole = p.in_whole(full).clone();
        // Under tensor parallelism, this rank's part of the state: the parts made whole.
        if (const auto& placement = p.tensor_parallel()) whole = tp::whole_of(whole, *placement);
        out.emplace_back(tensor_key(kind, p.name()), std::move(whole));
      }
    }
    for (const auto& p : buffer.params()) {
      const auto saved = optimizers.read(p.param());
      if (saved && saved->step) {
        out.emplace_back(tensor_key("step", p.name()), at::scalar_tensor(*saved->step, at::kLong));
      }
    }
  }
  return out;
}

}  // namespace fsdp
