#include "param_group.h"

#include "fsdp_state.h"
#include "trace.h"
#include "unit_comm.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <tuple>

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
                                            const torch::autograd::variable_list&) override {
    if (auto group = group_.lock()) group->on_grad_accumulated(entry_);
    return outputs;
  }

 private:
  std::weak_ptr<ParamGroup> group_;
  size_t entry_;
};

}  // namespace

ParamGroup::ParamGroup(std::string name, FlatParam flat, FsdpState& state, bool is_root)
    : name_(std::move(name)),
      label_(is_root ? "root" : name_),
      flat_(std::move(flat)),
      state_(state),
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

bool ParamGroup::issue_unshard(bool optional) {
  if (sharded_state_ != ShardedState::Sharded) return true;
  if (!flat_.needs_unshard()) {  // a shard group of one in full precision: the shard is the unit
    for (auto& part : parts_) part->issue_unshard(optional);
    sharded_state_ = ShardedState::Unsharded;
    return true;
  }
  if (rate_limited()) {
    WaitSpan waiting("rate_limiter", label_);
    if (!state_.limiter().acquire(optional)) return false;
    holds_limiter_slot_ = true;
  }
  for (auto& part : parts_) part->issue_unshard(optional);
  flat_.allocate_full();
  if (!flat_.sharded() && !flat_.offloaded()) {
    // A shard group of one rank (W = 1) only casts its shard for compute: on the compute stream,
    // in order. On a lane's high-priority stream the cast would overlap GEMMs and slow them
    // (measured on an H200: 2.5x the cast's own time), with no communication to hide.
    at::NoGradGuard no_grad;
    gather_unit(flat_, state_.collectives());
    all_gather_ = CommHandle();
    sharded_state_ = ShardedState::Unsharding;
    return true;
  }
  const std::string span = "all_gather " + label_;
  all_gather_ = state_.device().submit(CommLane::AllGather, [this, span] {
    TraceSpan trace(span, TraceLane::Communication);
    gather_unit(flat_, state_.collectives());
  });
  sharded_state_ = ShardedState::Unsharding;
  return true;
}

void ParamGroup::wait_unshard() {
  issue_unshard(/*optional=*/false);
  for (auto& part : parts_) part->wait_unshard();
  if (sharded_state_ == ShardedState::Unsharded) return;
  {
    WaitSpan waiting("all_gather", label_);
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
    state_.limiter().release();
  }
}

void ParamGroup::pre_forward() {
  span_start_ = std::chrono::steady_clock::now();
  state_.before_unit_forward(*this);
  issue_unshard(/*optional=*/false);
  state_.prefetch_forward_after(*this);
  wait_unshard();
}

void ParamGroup::post_forward(const std::vector<at::Tensor>& inputs,
                              const std::vector<at::Tensor>& outputs) {
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
  // The root's parameters are needed again at once by backward (its output is the loss);
  // SHARD_GRAD_OP (or reshard_after_forward(false)) keeps a unit's until its backward.
  const bool keep =
      will_backward && (is_root_ || !state_.options().unit_reshards_after_forward(name_));
  if (!keep) reshard();
  record_span("forward " + label_, TraceLane::Compute, span_start_);
}

void ParamGroup::pre_backward() {
  if (backward_state_ != BackwardState::Idle) return;  // another output got there first
  span_start_ = std::chrono::steady_clock::now();
  if (is_root_) state_.queue_finish_backward();
  backward_ran_ = true;
  issue_unshard(/*optional=*/false);
  if (state_.options().backward_prefetch() == BackwardPrefetch::BackwardPre) {
    state_.prefetch_backward_after(*this);
  }
  wait_unshard();
  begin_accumulating();
  for (auto& part : parts_) {
    if (part->flat_.requires_grad()) part->begin_accumulating();
  }
}

void ParamGroup::begin_accumulating() {
  if (flat_.requires_grad()) {
    // Under no_sync the sum so far is kept: keep adding to it.
    if (!full_grad_kept_) accumulate_into_shard_ = flat_.has_sharded_grads();
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
  record_span("backward " + label_, TraceLane::Compute, span_start_);
  if (!flat_.requires_grad()) {  // nothing to reduce: only free the parameters
    backward_state_ = BackwardState::Idle;
    reshard();
    return;
  }
  flat_.complete_full_grad();
  if (state_.options().backward_prefetch() == BackwardPrefetch::BackwardPost && !is_part_) {
    state_.prefetch_backward_after(*this);
  }
  if (flat_.grads_in_shard()) {  // a shard group of one: the shard already holds the gradient
    backward_state_ = BackwardState::Reduced;
    reshard(/*with_parts=*/false);
    return;
  }
  if (state_.no_sync()) {  // keep the unsharded gradient for the next backward
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
  if (rate_limited()) state_.limiter().reduction_issued();
  // The count ends when the task is destroyed, whether it ran, threw, or was skipped after an
  // earlier collective failed: a unit waiting in the limiter then meets the error, never hangs.
  auto end = std::make_shared<ReductionEnd>(rate_limited() ? &state_.limiter() : nullptr);
  const std::string span = "reduce_scatter " + label_;
  const ReducePlan plan = reduce_plan();
  reduce_scatter_ = state_.device().submit(CommLane::Reduce, [this, span, plan, end] {
    TraceSpan trace(span, TraceLane::Communication);
    at::NoGradGuard no_grad;
    reduce_unit_gradient(flat_, plan, state_.collectives(), state_.replicate_collectives());
    state_.device().release_after(CommLane::Reduce, flat_.take_full_grad_bytes());
  });
}

// A shard group of one rank without replicas (W = 1, not offloaded) whose reduction would be a
// copy: the gradients can go straight into the gradient shard, unless they add to a sum kept
// there (accumulation) or kept unsharded (no_sync).
bool ParamGroup::grads_need_no_reduction() const {
  const ReducePlan plan = reduce_plan();
  return !flat_.sharded() && state_.replicate_collectives() == nullptr && !flat_.offloaded() &&
         plan.pre == 1.0 &&
         plan.post == 1.0 && !accumulate_into_shard_ && !full_grad_kept_ && !state_.no_sync();
}

ReducePlan ParamGroup::reduce_plan() const {
  const c10::ScalarType grad_dtype = flat_.full_grad().scalar_type();
  ReducePlan plan;
  plan.dtype = full_precision_ ? grad_dtype : state_.reduce_dtype(grad_dtype);
  std::tie(plan.pre, plan.post) = state_.gradient_divide_factors(plan.dtype);
  plan.accumulate = accumulate_into_shard_;
  return plan;
}

void ParamGroup::finish_backward() {
  if (backward_state_ == BackwardState::Accumulating) post_backward();  // some grads never came
  if (backward_state_ == BackwardState::Reducing) {
    WaitSpan waiting("reduce_scatter", label_);
    reduce_scatter_.wait();
  }
  if (backward_state_ == BackwardState::Reducing || backward_state_ == BackwardState::Reduced) {
    flat_.use_sharded_grads();
  }
  reshard();  // e.g. a prefetched unit whose backward never ran
  backward_state_ = BackwardState::Idle;
  backward_ran_ = false;
}

UnitInfo ParamGroup::info() const {
  UnitInfo info;
  info.name = name_;
  info.num_params = static_cast<int64_t>(flat_.entries().size());
  info.numel = flat_.numel();
  info.padded_numel = flat_.padded_numel();
  info.shard_numel = flat_.shard_numel();
  info.element_size = flat_.element_size();
  info.compute_element_size = flat_.compute_element_size();
  info.is_root = is_root_;
  info.trainable = flat_.requires_grad();
  return info;
}

}  // namespace fsdp
