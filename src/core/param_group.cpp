#include "core/param_group.h"

#include "util/trace.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <functional>

namespace fsdp {

namespace {

// Runs after AccumulateGrad has added a parameter's gradient (the paper prefers this moment to a
// tensor hook, which fires before accumulation). `flat`, `entry`: the unit's flat parameter and
// the parameter's index in it.
class GradAccumulatedHook final : public torch::autograd::FunctionPostHook {
 public:
  GradAccumulatedHook(std::weak_ptr<ParamGroup> group, size_t flat, size_t entry)
      : group_(std::move(group)), flat_(flat), entry_(entry) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override;

 private:
  std::weak_ptr<ParamGroup> group_;
  size_t flat_;
  size_t entry_;
};

}  // namespace

ParamGroup::ParamGroup(std::string name, std::vector<FlatGroup> flats, UnitEnv env,
                       UnitEvents& events, bool is_root)
    : name_(std::move(name)),
      label_(is_root ? "root" : name_),
      flats_(std::move(flats)),
      env_(std::move(env)),
      events_(events),
      is_root_(is_root),
      limiter_(env_.limiter, label_),
      order_(*this, env_.conductor, limiter_, *this) {
  TORCH_INTERNAL_ASSERT(!flats_.empty(), "a unit has at least one flat parameter");
}

void ParamGroup::install_grad_hooks() {
  for (size_t f = 0; f < flats_.size(); ++f) {
    const auto& entries = flats_[f].flat.entries();
    for (size_t i = 0; i < entries.size(); ++i) {
      if (entries[i].grad_accumulator) hook(f, i);
    }
  }
}

void ParamGroup::install_collectives(UnitCollectives& collectives, const std::function<bool()>& pass_only) {
  for (FlatGroup& g : flats_) {
    g.gather = collectives.gather(g.flat, pass_only, [this, &g] {
      if (g.backward_state == BackwardState::Idle) reshard(g);
    });
    g.reduce = collectives.reduce(g.flat);
  }
}

void ParamGroup::hook(size_t flat, size_t entry) {
  flats_[flat].flat.entries()[entry].grad_accumulator->add_post_hook(
      std::make_unique<GradAccumulatedHook>(weak_from_this(), flat, entry));
}

void ParamGroup::set_name(const std::string& name) {
  name_ = name;
  label_ = is_root_ ? "root" : name;
}

ShardedState ParamGroup::sharded_state() const {
  auto all = [&](ShardedState state) {
    return std::all_of(flats_.begin(), flats_.end(), [&](const FlatGroup& g) { return g.sharded_state == state; });
  };
  if (all(ShardedState::Sharded)) return ShardedState::Sharded;
  if (all(ShardedState::Unsharded)) return ShardedState::Unsharded;
  return ShardedState::Unsharding;
}

bool ParamGroup::has_frozen_params() const {
  return std::any_of(flats_.begin(), flats_.end(), [](const FlatGroup& g) { return !g.trainable(); });
}

bool ParamGroup::needs_unshard() const {
  return std::any_of(flats_.begin(), flats_.end(), [](const FlatGroup& g) { return g.flat.needs_unshard(); });
}

void ParamGroup::begin_forward() {
  span_start_ = trace_now();
  release_cleared_gradients();
  // The backward an earlier forward was kept for never came, and the shards may have been
  // stepped since ([Note: between a forward and its backward]): gather them again.
  for (FlatGroup& g : flats_) {
    if (g.params_parked && g.backward_state == BackwardState::Idle) reshard(g);
  }
  issue_unshard(/*optional=*/false);
}

void ParamGroup::release_cleared_gradients() {
  for (FlatGroup& g : flats_) {
    // Not between the backwards of no_sync: they clear the gradients while their sum waits
    // unsharded, and the last one may still add it to the shard.
    if (!g.full_grad_kept) g.flat.release_cleared_grad_shard();  // [Note: gradient shards live as long as the gradients]
  }
}

bool ParamGroup::issue_unshard(bool optional) {
  auto sharded = [](const FlatGroup& g) { return g.sharded_state == ShardedState::Sharded; };
  if (std::none_of(flats_.begin(), flats_.end(), sharded)) return true;
  return order_.unshard(optional, /*needs_slot=*/needs_unshard());
}

void ParamGroup::issue_gathers() {
  for (FlatGroup& g : flats_) {
    if (g.sharded_state == ShardedState::Sharded) issue_all_gather(g);
  }
}

void ParamGroup::issue_all_gather(FlatGroup& g) {
  if (!g.flat.needs_unshard()) {  // a shard group of one in full precision: the shard is the unit
    g.sharded_state = ShardedState::Unsharded;
    return;
  }
  g.sharded_state = ShardedState::Unsharding;
  g.all_gather = g.gather->issue(g.flat, label_);
}

void ParamGroup::wait_unshard() {
  issue_unshard(/*optional=*/false);
  for (size_t f = 0; f < flats_.size(); ++f) {
    FlatGroup& g = flats_[f];
    if (g.sharded_state == ShardedState::Unsharded) {
      unpark(g);
      continue;
    }
    {
      TraceSpan waiting("wait all_gather", label_, TraceLane::Waits);
      g.all_gather.wait();
    }
    g.flat.use_full_params();
    for (size_t entry : g.flat.refresh_grad_accumulators()) hook(f, entry);
    g.sharded_state = ShardedState::Unsharded;
  }
}

void ParamGroup::reshard_all() {
  for (FlatGroup& g : flats_) reshard(g);
}

void ParamGroup::reshard(FlatGroup& g) {
  if (g.sharded_state == ShardedState::Sharded) return;
  if (g.sharded_state == ShardedState::Unsharding) g.all_gather.wait();  // never free under a collective
  g.flat.use_sharded_params();
  g.flat.free_full();
  g.sharded_state = ShardedState::Sharded;
  g.params_parked = false;
  release_slot_if_sharded();
}

// [Note: between a forward and its backward]
// A unit's state machine, per flat group: Sharded -> (all-gather) Unsharding -> Unsharded for its
// forward -> Sharded again after it, unless a backward will need the gathered buffer soon (the
// root, whose output is the loss; SHARD_GRAD_OP's units). Such a unit keeps its gathered buffer
// but is "parked": its parameters point back at the shard, as between steps, so that whatever
// the program does before that backward sees what an unsharded program would: an optimizer step
// (a training-mode forward for metrics, then step) steps the shards with the gradients of the
// shards' shape, state dicts read the shards. The unit's pre-backward unparks it (no
// communication: the buffer is still there, and autograd's saved views of it are valid), as it
// unshards a unit resharded after forward. When the backward never comes, the next forward
// reshards the parked unit first and gathers again: the optimizer may have stepped the shards.
void ParamGroup::park(FlatGroup& g) {
  if (g.sharded_state != ShardedState::Unsharded || !g.flat.needs_unshard()) return;
  g.flat.use_sharded_params();
  g.params_parked = true;
}

void ParamGroup::unpark(FlatGroup& g) {
  if (!g.params_parked) return;
  g.flat.use_full_params();
  for (size_t entry : g.flat.refresh_grad_accumulators()) hook(index_of(g), entry);
  g.params_parked = false;
}

void ParamGroup::take_in_rebound_params() {
  for (FlatGroup& g : flats_) {
    const auto [fresh, taken] = g.flat.take_in_rebound();
    if (taken == 0) continue;
    for (size_t entry : fresh) hook(index_of(g), entry);
    env_.conductor.shards_may_change();
    if (g.backward_state == BackwardState::Idle) reshard(g);
  }
}

void ParamGroup::release_slot_if_sharded() {
  if (order_.holds_slot() && sharded_state() == ShardedState::Sharded) order_.resharded();
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
  env_.conductor.shards_may_change();
  const bool in_backward = std::any_of(flats_.begin(), flats_.end(), [](const FlatGroup& g) {
    return g.backward_state != BackwardState::Idle;
  });
  if (in_backward) return false;
  take_in_rebound_params();
  reshard_all();
  return true;
}

bool ParamGroup::hook_backward(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs) {
  // A unit with parameters (frozen ones too: backward needs them to reach earlier units) is
  // unsharded again for backward. The root hooks its output even without parameters of its
  // own: its pre-backward queues the end-of-backward callback that completes every reduction.
  const bool has_params = is_root_ || flats_.size() > 1 || flats_.front().flat.numel() > 0;
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
  if (will_backward && has_frozen_params()) {
    // The gradient accumulators say when the trainable parameters are done, not when the frozen
    // ones are: the gradient of the unit's inputs does.
    std::weak_ptr<ParamGroup> self = weak_from_this();
    for (const auto& input : inputs) {
      if (!input.defined() || !input.requires_grad()) continue;
      const_cast<at::Tensor&>(input).register_hook([self](const at::Tensor&) {
        if (auto group = self.lock()) group->on_input_grad();
      });
    }
  }
  return will_backward;
}

void ParamGroup::end_forward(bool reshard) {
  if (env_.conductor.holds_unsharded()) {
    // Held: the parameters stay gathered, and in use, for the next forwards and backwards.
  } else if (reshard) {
    reshard_all();
  } else {
    for (FlatGroup& g : flats_) park(g);
  }
  record_span("forward", label_, TraceLane::Compute, span_start_);
}

void ParamGroup::pre_backward() {
  if (backward_ran_) return;  // another output got there first
  span_start_ = trace_now();
  backward_ran_ = true;
  env_.conductor.backward_reached(*this);
}

void ParamGroup::begin_backward(bool no_sync) {
  no_sync_ = no_sync;
  for (FlatGroup& g : flats_) {
    // The optimizer kept the gradient shard's sum: add to it. Under no_sync the unsharded sum
    // so far is kept instead: keep adding to that.
    if (g.trainable() && !g.full_grad_kept) g.accumulate_into_shard = g.flat.has_sharded_grads();
  }
  order_.begin_backward(gradient_path(flats_.front()));
}

void ParamGroup::allocate_gradients() {
  for (FlatGroup& g : flats_) {
    if (g.trainable()) g.flat.begin_full_grad(/*keep=*/g.full_grad_kept, /*into_shard=*/grads_need_no_reduction(g));
    g.grads_pending = g.flat.requires_grad_count();
    g.backward_state = BackwardState::Accumulating;
  }
}

void ParamGroup::on_grad_accumulated(size_t flat, size_t entry) {
  FlatGroup& g = flats_[flat];
  if (g.backward_state != BackwardState::Accumulating) return;
  g.flat.take_grad(entry);
  if (--g.grads_pending == 0) post_backward(g);
}

void ParamGroup::on_input_grad() {
  for (FlatGroup& g : flats_) {
    if (!g.trainable() && g.backward_state == BackwardState::Accumulating) post_backward(g);
  }
}

void ParamGroup::post_backward(FlatGroup& g) {
  if (is_first(g)) record_span("backward", label_, TraceLane::Compute, span_start_);
  if (g.trainable()) g.flat.complete_full_grad();
  order_.gradient_complete(index_of(g), is_first(g), gradient_path(g));
}

void ParamGroup::free_params(size_t flat) {
  if (!env_.conductor.holds_unsharded()) reshard(flats_[flat]);
}

void ParamGroup::settle_gradient(size_t flat, bool counted) {
  FlatGroup& g = flats_[flat];
  if (!g.trainable()) {  // nothing to reduce
    g.backward_state = BackwardState::Idle;
  } else if (g.flat.grads_in_shard()) {  // a shard group of one: the shard already holds the gradient
    g.backward_state = BackwardState::Reduced;
    events_.gradients_reduced(*this, g.flat, CommHandle());
  } else if (no_sync_) {  // keep the unsharded gradient for the next backward
    g.flat.keep_full_grad_wide();  // [Note: a kept gradient summed wide]
    g.full_grad_kept = true;
    g.backward_state = BackwardState::Idle;
  } else {
    g.backward_state = BackwardState::Reducing;
    issue_reduce_scatter(g, counted);
  }
}

void ParamGroup::issue_reduce_scatter(FlatGroup& g, bool counted) {
  g.full_grad_kept = false;
  if (g.flat.has_wide_kept_sum()) {  // [Note: a kept gradient summed wide]
    const int replicas = env_.reduce.world_size / g.flat.shard_group_size();
    if (rules::grads_into_shard(g.flat.placement(replicas), /*accumulating=*/false)) {
      g.flat.move_wide_kept_sum_into_shard(g.accumulate_into_shard);  // nothing to communicate
      g.backward_state = BackwardState::Reduced;
      events_.gradients_reduced(*this, g.flat, CommHandle());
      return;
    }
    g.flat.fold_wide_kept_sum();
  }
  RateLimiter* limiter = counted ? &env_.limiter : nullptr;
  if (limiter) limiter->reduction_issued();
  // The count ends when the task is destroyed, whether it ran, threw, or was skipped after an
  // earlier collective failed: a unit waiting in the limiter then meets the error, never hangs.
  auto end = std::make_shared<ReductionEnd>(limiter);
  const ReducePlan plan = reduce_plan(g);
  // Allocated here, on the caller's thread, before the task can: gradients_reduced hands out
  // views of it while the task runs (two lazy allocations would race to two buffers).
  g.flat.grad_shard();
  g.reduce_scatter = g.reduce->issue(g.flat, plan, std::move(end), label_);
  events_.gradients_reduced(*this, g.flat, g.reduce_scatter);
}

// The gradients go straight into the gradient shard (rules::grads_into_shard), unless they add to
// a sum kept there (accumulation) or kept unsharded (no_sync).
bool ParamGroup::grads_need_no_reduction(const FlatGroup& g) const {
  const int replicas = env_.reduce.world_size / g.flat.shard_group_size();
  const bool accumulating = g.accumulate_into_shard || g.full_grad_kept || no_sync_;
  return rules::grads_into_shard(g.flat.placement(replicas), accumulating);
}

GradientPath ParamGroup::gradient_path(const FlatGroup& g) const {
  return {g.trainable(), grads_need_no_reduction(g), g.full_grad_kept, no_sync_};
}

ReducePlan ParamGroup::reduce_plan(const FlatGroup& g) const {
  return plan_reduction(env_.reduce, g.flat.full_grad().scalar_type(), g.full_precision,
                        g.accumulate_into_shard);
}

void ParamGroup::finish_backward() {
  for (FlatGroup& g : flats_) {
    if (g.backward_state == BackwardState::Accumulating) post_backward(g);  // some grads never came
    if (g.backward_state == BackwardState::Reducing) {
      TraceSpan waiting("wait reduce_scatter", label_, TraceLane::Waits);
      // Offloaded, the optimizer reads the gradient shard on the host after backward.
      if (g.flat.offloaded()) {
        g.reduce_scatter.wait_host();
      } else {
        g.reduce_scatter.wait();
      }
    }
    if (g.backward_state == BackwardState::Reducing || g.backward_state == BackwardState::Reduced) {
      g.flat.use_sharded_grads();
    }
    g.backward_state = BackwardState::Idle;
  }
  if (!env_.conductor.holds_unsharded()) reshard_all();  // e.g. a prefetched unit whose backward never ran
  backward_ran_ = false;
}

// [Note: units held unsharded] (core/unshard_hold.cpp): the reduction a synchronising backward
// would issue (reduce_plan), waited for at once.
void ParamGroup::reduce_kept_gradients() {
  for (FlatGroup& g : flats_) {
    if (!g.trainable() || !g.full_grad_kept) continue;
    g.backward_state = BackwardState::Reducing;
    issue_reduce_scatter(g, /*counted=*/false);
  }
  no_sync_ = false;
  finish_backward();
}

torch::autograd::variable_list GradAccumulatedHook::operator()(
    const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
  if (auto group = group_.lock()) group->on_grad_accumulated(flat_, entry_);
  return outputs;
}

}  // namespace fsdp
