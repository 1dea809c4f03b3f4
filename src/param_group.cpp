#include "param_group.h"

#include "fsdp_state.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace fsdp {

namespace {

// Runs after AccumulateGrad has added a parameter's gradient (the paper prefers this moment to a
// tensor hook, which fires before accumulation).
class GradAccumulatedHook final : public torch::autograd::FunctionPostHook {
 public:
  explicit GradAccumulatedHook(std::weak_ptr<ParamGroup> group) : group_(std::move(group)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (auto group = group_.lock()) group->on_grad_accumulated();
    return outputs;
  }

 private:
  std::weak_ptr<ParamGroup> group_;
};

}  // namespace

ParamGroup::ParamGroup(std::string name, FlatParam flat, Collectives& collectives,
                       FsdpState& state, bool is_root)
    : name_(std::move(name)),
      flat_(std::move(flat)),
      collectives_(collectives),
      state_(state),
      is_root_(is_root) {}

void ParamGroup::install_grad_hooks() {
  std::weak_ptr<ParamGroup> self = weak_from_this();
  for (auto& entry : flat_.entries()) {
    if (entry.grad_accumulator) {
      entry.grad_accumulator->add_post_hook(std::make_unique<GradAccumulatedHook>(self));
    }
  }
}

void ParamGroup::unshard() {
  if (sharded_state_ == ShardedState::Unsharded) return;
  flat_.allocate_full();
  collectives_.all_gather(flat_.full(), flat_.shard());
  flat_.use_full_params();
  sharded_state_ = ShardedState::Unsharded;
}

void ParamGroup::reshard() {
  if (sharded_state_ == ShardedState::Sharded) return;
  flat_.use_sharded_params();
  flat_.free_full();
  sharded_state_ = ShardedState::Sharded;
}

void ParamGroup::pre_forward() { unshard(); }

void ParamGroup::post_forward(const std::vector<at::Tensor>& outputs) {
  const bool will_backward = at::GradMode::is_enabled() && flat_.requires_grad();
  if (will_backward) {
    std::weak_ptr<ParamGroup> self = weak_from_this();
    for (const auto& output : outputs) {
      if (!output.defined() || !output.requires_grad()) continue;
      const_cast<at::Tensor&>(output).register_hook([self](const at::Tensor&) {
        if (auto group = self.lock()) group->pre_backward();
      });
    }
  }
  // The root's parameters are needed again at once by backward (its output is the loss).
  if (!is_root_ || !will_backward) reshard();
}

void ParamGroup::pre_backward() {
  if (backward_state_ != BackwardState::Idle) return;  // another output got there first
  if (is_root_) state_.queue_finish_backward();
  unshard();
  accumulate_into_shard_ = flat_.has_sharded_grads();
  flat_.allocate_full_grad();
  flat_.use_full_grads();
  grads_pending_ = flat_.requires_grad_count();
  backward_state_ = BackwardState::Accumulating;
}

void ParamGroup::on_grad_accumulated() {
  if (backward_state_ != BackwardState::Accumulating) return;
  if (--grads_pending_ == 0) reduce_grad();
}

void ParamGroup::reduce_grad() {
  at::NoGradGuard no_grad;
  at::Tensor& grad_shard = flat_.grad_shard();
  const int world = collectives_.size();
  if (accumulate_into_shard_) {
    at::Tensor reduced = at::empty_like(grad_shard);
    collectives_.reduce_scatter_sum(reduced, flat_.full_grad());
    grad_shard.add_(reduced, 1.0 / world);
  } else {
    collectives_.reduce_scatter_sum(grad_shard, flat_.full_grad());
    grad_shard.div_(world);
  }
  flat_.use_sharded_grads();
  flat_.free_full_grad();
  reshard();
  backward_state_ = BackwardState::Reduced;
}

void ParamGroup::finish_backward() {
  if (backward_state_ == BackwardState::Accumulating) reduce_grad();
  reshard();
  backward_state_ = BackwardState::Idle;
}

UnitInfo ParamGroup::info() const {
  UnitInfo info;
  info.name = name_;
  info.num_params = static_cast<int64_t>(flat_.entries().size());
  info.numel = flat_.numel();
  info.padded_numel = flat_.padded_numel();
  info.shard_numel = flat_.shard_numel();
  info.element_size = flat_.element_size();
  info.is_root = is_root_;
  return info;
}

}  // namespace fsdp
