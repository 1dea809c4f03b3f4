#include "core/param_group.h"

#include "device/device.h"
#include "core/rate_limiter.h"
#include "util/trace.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>

namespace fsdp {

namespace {

// Runs after AccumulateGrad has added a parameter's gradient (the paper prefers this moment to a
// tensor hook, which fires before accumulation). `entry`: the parameter's index in the flat
// parameter.
class GradAccumulatedHook final : public torch::autograd::FunctionPostHook {
 public:
  GradAccumulatedHook(std::weak_ptr<ParamGroup> group, size_t entry)
      : group_(std::move(group)), entry_(entry) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override;

 private:
  std::weak_ptr<ParamGroup> group_;
  size_t entry_;
};

}  // namespace

ParamGroup::ParamGroup(std::string name, FlatParam flat, UnitEnv env, UnitEvents& events,
                       bool is_root)
    : name_(std::move(name)),
      label_(is_root ? "root" : name_),
      flat_(std::move(flat)),
      env_(std::move(env)),
      events_(events),
      is_root_(is_root) {}

void ParamGroup::install_grad_hooks() {
  for (size_t i = 0; i < flat_.entries().size(); ++i) {
    if (flat_.entries()[i].grad_accumulator) hook(i);
  }
}

void ParamGroup::hook(size_t entry) {
  flat_.entries()[entry].grad_accumulator->add_post_hook(
      std::make_unique<GradAccumulatedHook>(weak_from_this(), entry));
}

void ParamGroup::set_name(const std::string& name) {
  name_ = name;
  label_ = is_root_ ? "root" : name;
  for (auto& part : parts_) part->set_name(name);
}

void ParamGroup::attach_part(std::shared_ptr<ParamGroup> part) {
  part->is_part_ = true;
  parts_.push_back(std::move(part));
}

bool ParamGroup::has_frozen_part() const {
  return std::any_of(parts_.begin(), parts_.end(),
                     [](const auto& part) { return !part->flat_.requires_grad(); });
}

void ParamGroup::begin_forward() {
  span_start_ = trace_now();
  release_cleared_gradients();
  issue_unshard(/*optional=*/false);
}

void ParamGroup::release_cleared_gradients() {
  // Not between the backwards of no_sync: they clear the gradients while their sum waits
  // unsharded, and the last one may still add it to the shard.
  if (full_grad_kept_) return;
  flat_.release_cleared_grad_shard();  // [Note: gradient shards live as long as the gradients]
  for (auto& part : parts_) part->release_cleared_gradients();
}

bool ParamGroup::issue_unshard(bool optional) {
  if (sharded_state_ != ShardedState::Sharded) return true;
  if (!flat_.needs_unshard()) {  // a shard group of one in full precision: the shard is the unit
    for (auto& part : parts_) part->issue_unshard(optional);
    sharded_state_ = ShardedState::Unsharded;
    return true;
  }
  if (rate_limited()) {
    TraceSpan waiting("wait rate_limiter", label_, TraceLane::Waits);
    if (!env_.limiter.acquire(optional)) return false;
    holds_limiter_slot_ = true;
  }
  for (auto& part : parts_) part->issue_unshard(optional);
  flat_.allocate_full();
  if (!flat_.sharded() && !flat_.offloaded()) {
    // A shard group of one rank (W = 1) only casts its shard for compute: on the compute stream,
    // in order. On a lane's high-priority stream the cast would overlap GEMMs and slow them
    // (measured on an H200: 2.5x the cast's own time), with no communication to hide.
    at::NoGradGuard no_grad;
    gather_unit(flat_, env_.shard_group);
    all_gather_ = CommHandle();
    sharded_state_ = ShardedState::Unsharding;
    return true;
  }
  all_gather_ = env_.device.submit(CommLane::AllGather, [this] {
    TraceSpan trace("all_gather", label_, TraceLane::Communication);
    gather_unit(flat_, env_.shard_group);
  });
  sharded_state_ = ShardedState::Unsharding;
  return true;
}

void ParamGroup::wait_unshard() {
  issue_unshard(/*optional=*/false);
  for (auto& part : parts_) part->wait_unshard();
  if (sharded_state_ == ShardedState::Unsharded) return;
  {
    TraceSpan waiting("wait all_gather", label_, TraceLane::Waits);
    all_gather_.wait();
  }
  flat_.use_full_params();
  for (size_t entry : flat_.refresh_grad_accumulators()) hook(entry);
  sharded_state_ = ShardedState::Unsharded;
}

void ParamGroup::reshard(bool with_parts) {
  if (with_parts) {
    for (auto& part : parts_) part->reshard();
  }
  if (sharded_state_ == ShardedState::Sharded) return;
  if (sharded_state_ == ShardedState::Unsharding) all_gather_.wait();  // never free under a collective
  flat_.use_sharded_params();
  flat_.free_full();
  sharded_state_ = ShardedState::Sharded;
  if (holds_limiter_slot_) {  // [Note: rate limiter slots]
    holds_limiter_slot_ = false;
    env_.limiter.release();
  }
}

// [Note: resharding between steps]
// A forward under grad mode leaves the root (and, under SHARD_GRAD_OP, every unit) unsharded for
// its backward. When that backward never comes (an evaluation without NoGradGuard, as public
// programs often write it), the unit stays unsharded: its parameters are views of the gathered
// buffer, and the next forward, finding the unit unsharded, gathers nothing. A state dict or a
// checkpoint loaded into the shards in between would not reach that forward (it computed with the
// old values), and a checkpoint refused to save. So the between-step entry points reshard first,
// as PyTorch FSDP2 does before a state dict; a backward that does come later unshards the unit
// again in its pre-backward (backward_reached), as for any unit resharded after forward.
bool ParamGroup::reshard_unless_in_backward() {
  if (backward_state_ != BackwardState::Idle) return false;
  reshard();
  return true;
}

void ParamGroup::post_forward(const std::vector<at::Tensor>& inputs,
                              const std::vector<at::Tensor>& outputs, bool reshard_after_forward) {
  // A unit with parameters (frozen ones too: backward needs them to reach earlier units) is
  // unsharded again for backward. The root hooks its output even without parameters of its
  // own: its pre-backward queues the end-of-backward callback that completes every reduction.
  const bool has_params = is_root_ || flat_.numel() > 0 || !parts_.empty();
  bool will_backward = false;
  if (at::GradMode::is_enabled() && has_params) {
    std::weak_ptr<ParamGroup> self = weak_from_this();
    for (const auto& output : outputs) {
      if (!output.defined() || !output.requires_grad()) continue;
      const_cast<at::Tensor&>(output).register_hook([self](const at::Tensor&) {
        if (auto group = self.lock()) group->pre_backward();
      });
      will_backward = true;
    }
  }
  if (will_backward && (!flat_.requires_grad() || has_frozen_part())) {
    // The gradient accumulators say when the trainable parameters are done, not when the frozen
    // ones are (a frozen layer's input gradient may come after every trainable layer's): the
    // gradient of the unit's inputs does.
    std::weak_ptr<ParamGroup> self = weak_from_this();
    for (const auto& input : inputs) {
      if (!input.defined() || !input.requires_grad()) continue;
      const_cast<at::Tensor&>(input).register_hook([self](const at::Tensor&) {
        if (auto group = self.lock()) group->on_input_grad();
      });
    }
  }
  if (!will_backward || reshard_after_forward) reshard();
  record_span("forward", label_, TraceLane::Compute, span_start_);
}

void ParamGroup::pre_backward() {
  if (backward_state_ != BackwardState::Idle) return;  // another output got there first
  span_start_ = trace_now();
  backward_ran_ = true;
  events_.backward_reached(*this);
}

void ParamGroup::begin_backward(bool no_sync) {
  wait_unshard();
  begin_accumulating(no_sync);
  for (auto& part : parts_) {
    if (part->flat_.requires_grad()) part->begin_accumulating(no_sync);
  }
}

void ParamGroup::begin_accumulating(bool no_sync) {
  no_sync_ = no_sync;
  if (flat_.requires_grad()) {
    // Under no_sync the sum so far is kept: keep adding to it.
    if (!full_grad_kept_) accumulate_into_shard_ = flat_.has_sharded_grads();
    if (!full_grad_kept_ && !grads_need_no_reduction() && rate_limited()) {
      TraceSpan waiting("wait rate_limiter", label_, TraceLane::Waits);
      env_.limiter.wait_for_reductions();
    }
    flat_.begin_full_grad(/*keep=*/full_grad_kept_, /*into_shard=*/grads_need_no_reduction());
  }
  grads_pending_ = flat_.requires_grad_count();
  backward_state_ = BackwardState::Accumulating;
}

void ParamGroup::on_grad_accumulated(size_t entry) {
  if (backward_state_ != BackwardState::Accumulating) return;
  flat_.take_grad(entry);
  if (--grads_pending_ == 0) post_backward();
}

void ParamGroup::on_input_grad() {
  for (auto& part : parts_) {
    if (!part->flat_.requires_grad()) part->reshard();
  }
  if (!flat_.requires_grad() && backward_state_ == BackwardState::Accumulating) post_backward();
}

void ParamGroup::post_backward() {
  record_span("backward", label_, TraceLane::Compute, span_start_);
  if (!flat_.requires_grad()) {  // nothing to reduce: only free the parameters
    backward_state_ = BackwardState::Idle;
    reshard();
    return;
  }
  flat_.complete_full_grad();
  events_.gradient_ready(*this);
  if (flat_.grads_in_shard()) {  // a shard group of one: the shard already holds the gradient
    backward_state_ = BackwardState::Reduced;
    reshard(/*with_parts=*/false);
    events_.gradients_reduced(*this, CommHandle());
    return;
  }
  if (no_sync_) {  // keep the unsharded gradient for the next backward
    full_grad_kept_ = true;
    backward_state_ = BackwardState::Idle;
    reshard(/*with_parts=*/false);
    return;
  }
  backward_state_ = BackwardState::Reducing;
  // The gradients are complete: autograd needs these parameters no more (a frozen part waits for
  // the unit's input gradient, on_input_grad; a full-precision part for its own gradients).
  reshard(/*with_parts=*/false);
  issue_reduce_scatter();
}

void ParamGroup::issue_reduce_scatter() {
  full_grad_kept_ = false;
  RateLimiter* limiter = rate_limited() ? &env_.limiter : nullptr;
  if (limiter) limiter->reduction_issued();
  // The count ends when the task is destroyed, whether it ran, threw, or was skipped after an
  // earlier collective failed: a unit waiting in the limiter then meets the error, never hangs.
  auto end = std::make_shared<ReductionEnd>(limiter);
  const ReducePlan plan = reduce_plan();
  // Allocated here, on the caller's thread, before the task can: gradients_reduced hands out
  // views of it while the task runs (two lazy allocations would race to two buffers).
  flat_.grad_shard();
  reduce_scatter_ = env_.device.submit(CommLane::Reduce, [this, plan, end] {
    TraceSpan trace("reduce_scatter", label_, TraceLane::Communication);
    at::NoGradGuard no_grad;
    reduce_unit_gradient(flat_, plan, env_.shard_group, env_.replicas);
    env_.device.release_after(CommLane::Reduce, flat_.take_full_grad_bytes());
  });
  events_.gradients_reduced(*this, reduce_scatter_);
}

// A shard group of one rank without replicas (W = 1, not offloaded) whose reduction would be a
// copy: the gradients can go straight into the gradient shard, unless they add to a sum kept
// there (accumulation) or kept unsharded (no_sync).
bool ParamGroup::grads_need_no_reduction() const {
  const ReducePlan plan = reduce_plan();
  return !flat_.sharded() && env_.replicas == nullptr && !flat_.offloaded() && plan.pre == 1.0 &&
         plan.post == 1.0 && !accumulate_into_shard_ && !full_grad_kept_ && !no_sync_;
}

ReducePlan ParamGroup::reduce_plan() const {
  return plan_reduction(env_.reduce, flat_.full_grad().scalar_type(), full_precision_,
                        accumulate_into_shard_);
}

void ParamGroup::finish_backward() {
  if (backward_state_ == BackwardState::Accumulating) post_backward();  // some grads never came
  if (backward_state_ == BackwardState::Reducing) {
    TraceSpan waiting("wait reduce_scatter", label_, TraceLane::Waits);
    // Offloaded, the optimizer reads the gradient shard on the host after backward.
    if (flat_.offloaded()) {
      reduce_scatter_.wait_host();
    } else {
      reduce_scatter_.wait();
    }
  }
  if (backward_state_ == BackwardState::Reducing || backward_state_ == BackwardState::Reduced) {
    flat_.use_sharded_grads();
  }
  reshard();  // e.g. a prefetched unit whose backward never ran
  backward_state_ = BackwardState::Idle;
  backward_ran_ = false;
}

torch::autograd::variable_list GradAccumulatedHook::operator()(
    const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
  if (auto group = group_.lock()) group->on_grad_accumulated(entry_);
  return outputs;
}

}  // namespace fsdp
