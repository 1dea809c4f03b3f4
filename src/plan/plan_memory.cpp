#include "plan/plan_memory.h"

#include "core/unit_rules.h"
#include "plan/plan_optimizer.h"

#include <algorithm>
#include <deque>
#include <string>
#include <vector>

namespace fsdp::planning {

namespace {

// The running memory of one rank and its highest point so far.
class Timeline {
 public:
  Timeline(MemoryBreakdown start, std::string suffix)
      : now_(start), peak_(start), peak_at_("the start of the step" + suffix), suffix_(std::move(suffix)) {}

  MemoryBreakdown& now() { return now_; }
  /// A moment that may be the peak: `transient` more workspace than now.
  void check(int64_t transient, const std::string& when) {
    MemoryBreakdown m = now_;
    m.workspace += transient;
    if (m.total() > peak_.total()) {
      peak_ = m;
      peak_at_ = when + suffix_;
    }
  }
  const MemoryBreakdown& peak() const { return peak_; }
  const std::string& peak_at() const { return peak_at_; }

 private:
  MemoryBreakdown now_, peak_;
  std::string peak_at_, suffix_;
};

std::string unit_label(const UnitLayout& unit) { return unit.name.empty() ? "the root" : unit.name; }

// [Note: micro-batches in the plan] Gradient accumulation changes what a backward holds, so the
// replay runs each kind of micro-batch a step has and keeps the highest peak:
// - synchronised (the default): the first is a step of its own; from the second on, every
//   gradient shard the first allocated is alive from the start, and each reduction lands in a
//   temporary that is added to the shard, so even at W = 1 gradients no longer go straight into
//   the shard (rules::grads_into_shard with a sum to add to).
// - no_sync: the micro-batches before the last reduce nothing and keep each unit's unsharded
//   gradient; from the second on, every one of them is alive from the start; the last reduces
//   them all (into shards zero_grad freed).
struct MicroBatch {
  int64_t index = 1;           // 1-based, for the peak's label
  bool shards_hold_sum = false;  // gradient shards alive from an earlier backward
  bool full_grads_kept = false;  // no_sync kept every unit's unsharded gradient
  bool reduces = true;           // false under no_sync before the last micro-batch
  bool last = true;              // the optimizer step follows
  // The gradients cannot go straight into the shard: there is a sum to add to, or to keep.
  bool accumulating() const { return shards_hold_sum || full_grads_kept || !reduces; }
};

std::vector<MicroBatch> micro_batch_kinds(const PlanPolicy& policy) {
  const int64_t n = policy.micro_batches;
  if (n == 1) return {MicroBatch{}};
  if (!policy.no_sync) {
    return {MicroBatch{1, false, false, true, /*last=*/false}, MicroBatch{2, /*shards_hold_sum=*/true}};
  }
  std::vector<MicroBatch> kinds = {MicroBatch{1, false, false, /*reduces=*/false, false}};
  if (n > 2) kinds.push_back(MicroBatch{2, false, /*full_grads_kept=*/true, false, false});
  kinds.push_back(MicroBatch{n, false, true, true, true});
  return kinds;
}

std::string micro_batch_text(const MicroBatch& micro, const PlanPolicy& policy) {
  if (policy.micro_batches == 1) return "";
  const bool representative = !policy.no_sync && micro.index == 2;  // stands for 2..n
  return " (micro-batch " + std::to_string(micro.index) +
         (representative && policy.micro_batches > 2 ? "-" + std::to_string(policy.micro_batches) : "") +
         " of " + std::to_string(policy.micro_batches) + ")";
}

// Replays forward and backward of one step over the units (index 0: the root).
class StepReplay {
 public:
  StepReplay(const PlanSetup& setup, const RankLayout& layout, const MicroBatch& micro, Timeline& timeline)
      : setup_(setup), layout_(layout), micro_(micro), t_(timeline), unsharded_(layout.units.size(), false),
        batch_(setup.policy.batch), checkpointing_(setup.policy.fsdp.activation_checkpointing()),
        limit_(setup.policy.fsdp.limit_all_gathers()), order_(forward_order()) {}

  void forward() {
    const PlanModel& model = setup_.model;
    unshard(0);
    if (setup_.policy.fsdp.forward_prefetch()) prefetch_forward_after(0);
    t_.check(batch_ * model.root_pre.forward_transient, "forward of the root (before the units)");
    t_.now().activations += batch_ * model.root_pre.saved;
    for (size_t u = 1; u < layout_.units.size(); ++u) {
      unshard(u);
      if (setup_.policy.fsdp.forward_prefetch()) prefetch_forward_after(u);
      const PlanActivations& a = activations(u);
      // Under checkpointing nothing is saved, but the intermediates exist while it runs: at most
      // what it would have saved.
      const int64_t running = a.forward_transient + (checkpointing_ ? a.saved - a.checkpointed : 0);
      t_.check(batch_ * running, "forward of " + unit_label(layout_.units[u]));
      t_.now().activations += batch_ * (checkpointing_ ? a.checkpointed : a.saved);
      if (layout_.units[u].reshard_after_forward) reshard(u);
    }
    const PlanActivations& head = model.root.activations;
    t_.check(batch_ * head.forward_transient, "forward of the root (after the units)");
    t_.now().activations += batch_ * head.saved;
  }

  void backward() {
    const PlanModel& model = setup_.model;
    const size_t last = layout_.units.size() - 1;
    begin_gradients(0);
    if (prefetches_before_backward()) prefetch_backward_after(0);
    const PlanActivations& head = model.root.activations;
    t_.check(batch_ * head.backward_transient + model.root.backward_workspace, "backward of the root (before the units)");
    // The head frees what it saved and the last unit's output (its input).
    t_.now().activations -= batch_ * (head.saved + (last >= 1 ? activations(last).checkpointed : 0));
    for (size_t u = last; u >= 1; --u) {
      unshard(u);
      if (prefetches_before_backward()) prefetch_backward_after(u);
      begin_gradients(u);
      const PlanActivations& a = activations(u);
      if (checkpointing_) t_.now().activations += batch_ * a.saved;  // recomputed
      t_.check(batch_ * a.backward_transient + setup_.model.units[u - 1].backward_workspace,
               "backward of " + unit_label(layout_.units[u]));
      // Freed: what it saved but its output (gone with the unit after it: checkpointed, the
      // recomputed copy too), and its input, the unit before it's output.
      t_.now().activations -= batch_ * (checkpointing_ ? a.saved : a.saved - a.checkpointed);
      if (u > 1) t_.now().activations -= batch_ * activations(u - 1).checkpointed;
      if (setup_.policy.fsdp.backward_prefetch() == BackwardPrefetch::BackwardPost) prefetch_backward_after(u);
      reshard(u);
      reduce(u);
    }
    t_.check(batch_ * model.root_pre.backward_transient + model.root.backward_workspace,
             "backward of the root (after the units)");
    reduce(0);
    // Every gradient shard, until zero_grad frees them.
    t_.check(0, micro_.last ? "the optimizer step" : "the end of backward");
  }

 private:
  const PlanActivations& activations(size_t u) const { return setup_.model.units[u - 1].activations; }
  bool prefetches_before_backward() const {
    return setup_.policy.fsdp.backward_prefetch() == BackwardPrefetch::BackwardPre;
  }
  bool rate_limited(size_t u) const { return rules::rate_limited(/*is_root=*/u == 0); }
  size_t index_of(const UnitLayout* unit) const { return static_cast<size_t>(unit - layout_.units.data()); }
  // The units after the root in forward order, as the engine records them.
  std::vector<const UnitLayout*> forward_order() const {
    std::vector<const UnitLayout*> order;
    for (size_t u = 1; u < layout_.units.size(); ++u) order.push_back(&layout_.units[u]);
    return order;
  }
  // The rules' prefetch targets (the order is the same every iteration).
  void prefetch_forward_after(size_t u) {
    if (const UnitLayout* next = rules::forward_prefetch_target(order_, &layout_.units[u], /*is_root=*/u == 0)) {
      prefetch(index_of(next));
    }
  }
  void prefetch_backward_after(size_t u) {
    if (const UnitLayout* next = rules::backward_prefetch_target(order_, &layout_.units[u], /*is_root=*/u == 0)) {
      prefetch(index_of(next));
    }
  }

  void unshard(size_t u) {
    if (unsharded_[u]) return;
    unsharded_[u] = true;
    if (rate_limited(u)) ++in_flight_;
    t_.now().unsharded_params += layout_.units[u].unsharded_params;
  }
  // A prefetch at the rate limiter's limit is refused.
  void prefetch(size_t u) {
    if (unsharded_[u] || (rate_limited(u) && rules::limiter_refuses_prefetch(limit_, in_flight_))) return;
    unshard(u);
  }
  void reshard(size_t u) {
    if (!unsharded_[u]) return;
    unsharded_[u] = false;
    if (rate_limited(u)) --in_flight_;
    t_.now().unsharded_params -= layout_.units[u].unsharded_params;
  }
  int64_t unsharded_grad(const UnitLayout& unit) const {
    return micro_.accumulating() ? unit.accumulating_grad : unit.unsharded_grad;
  }
  bool grads_into_shard(const UnitLayout& unit) const { return unit.grads_into_shard && !micro_.accumulating(); }
  void begin_gradients(size_t u) {
    const UnitLayout& unit = layout_.units[u];
    if (!micro_.full_grads_kept) t_.now().unsharded_grads += unsharded_grad(unit);
    if (grads_into_shard(unit)) allocate_grad_shard(unit);
  }
  // Backward allocates a gradient shard that zero_grad freed.
  void allocate_grad_shard(const UnitLayout& unit) {
    if (!setup_.policy.gradients_kept && !micro_.shards_hold_sum) t_.now().sharded_grads += unit.grad_shard;
  }
  // The reduce-scatter is issued; the limiter lets rules::kReductionsInFlight stay in flight
  // while the next unit computes, so the gradients before them are freed now (planned at their
  // latest).
  // Under no_sync (not the last micro-batch) nothing is reduced: the unsharded gradient stays.
  void reduce(size_t u) {
    const UnitLayout& unit = layout_.units[u];
    if (!micro_.reduces) {
      if (u == 0) reshard(0);
      return;
    }
    while (pending_.size() >= static_cast<size_t>(rules::kReductionsInFlight)) {
      const size_t done = pending_.front();
      pending_.pop_front();
      t_.now().unsharded_grads -= unsharded_grad(layout_.units[done]);
    }
    if (!grads_into_shard(unit)) allocate_grad_shard(unit);  // before the task runs
    // A sum in the shard is added to from a temporary.
    const int64_t output = gradients_held() ? unit.accumulating_reduce_output : unit.reduce_output;
    t_.check(output, "reduction of " + unit_label(unit));
    if (u == 0) {  // the end of backward waits for every reduction
      t_.now().unsharded_grads -= unsharded_grad(unit);
      reshard(0);
      return;
    }
    pending_.push_back(u);
  }
  // Gradient shards already hold a sum when the reduction lands (kept by zero_grad, or earlier
  // micro-batches): the reduction adds to it.
  bool gradients_held() const { return setup_.policy.gradients_kept || micro_.shards_hold_sum; }


  const PlanSetup& setup_;
  const RankLayout& layout_;
  const MicroBatch& micro_;
  Timeline& t_;
  std::vector<bool> unsharded_;
  std::deque<size_t> pending_;
  int64_t batch_;
  bool checkpointing_;
  int limit_;
  int in_flight_ = 0;
  std::vector<const UnitLayout*> order_;  // forward_order()
};

}  // namespace

RankMemory replay_step_memory(const PlanSetup& setup, const RankLayout& layout) {
  RankMemory rank;
  rank.rank = layout.rank;
  const Precision& p = layout.precision;
  const OptimizerBytes optimizer = optimizer_bytes(setup.policy.optimizer, p.shard_bytes);
  // The step starts after zero_grad: no gradient shard yet ([Note: gradient shards live as long
  // as the gradients]), backward allocates them; unless zero_grad zeroed them in place.
  MemoryBreakdown start;
  int64_t grad_shards = 0, full_grads = 0;
  for (const auto& unit : layout.units) {
    start.sharded_params += unit.shard_numel * p.shard_bytes;
    if (unit.trainable) grad_shards += unit.shard_numel * p.shard_bytes;
    start.optimizer_state += unit.piece_numel * optimizer.state_per_element;
    full_grads += unit.accumulating_grad;
  }
  rank.model_states = start.sharded_params + grad_shards + start.optimizer_state;
  const bool offload = setup.policy.fsdp.cpu_offload();
  if (offload) {  // model states in host memory
    rank.offloaded_bytes = rank.model_states;
    start.sharded_params = start.optimizer_state = 0;
  }
  start.program = setup.model.resident_bytes + setup.policy.batch * setup.model.input_bytes_per_sequence;
  bool first = true;
  for (const MicroBatch& micro : micro_batch_kinds(setup.policy)) {
    MemoryBreakdown begin = start;
    if (!offload && (setup.policy.gradients_kept || micro.shards_hold_sum)) begin.sharded_grads = grad_shards;
    if (micro.full_grads_kept) begin.unsharded_grads = full_grads;
    Timeline timeline(begin, micro_batch_text(micro, setup.policy));
    StepReplay replay(setup, layout, micro, timeline);
    replay.forward();
    replay.backward();
    if (first || timeline.peak().total() > rank.peak.total()) {
      rank.peak = timeline.peak();
      rank.peak_at = timeline.peak_at();
    }
    first = false;
  }
  return rank;
}

}  // namespace fsdp::planning
