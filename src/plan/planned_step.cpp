#include "plan/planned_step.h"

#include "core/step_conductor.h"
#include "core/unit_order.h"
#include "plan/planned_limiter.h"

#include <algorithm>
#include <deque>
#include <memory>

namespace fsdp::planning {

Timeline::Timeline(MemoryBreakdown start, std::string suffix)
    : now_(start), peak_(start), peak_at_("the start of the step" + suffix), suffix_(std::move(suffix)) {}

void Timeline::check(int64_t transient, const std::string& when) {
  MemoryBreakdown m = now_;
  m.workspace += transient;
  if (m.total() > peak_.total()) {
    peak_ = m;
    peak_at_ = when + suffix_;
  }
}

namespace {

std::string unit_label(const UnitLayout& unit) { return unit.name.empty() ? "the root" : unit.name; }

class PlannedUnit;

// What the planned units of one step share: the memory, the rate limiter, the unsharded
// gradients awaiting reduction, the collectives issued.
struct StepCounts {
  StepCounts(const PlanSetup& s, const RankLayout& l, const MicroBatch& m, Timeline t)
      : setup(s), layout(l), micro(m), timeline(std::move(t)),
        limiter(s.policy.fsdp.limit_all_gathers(), [this](int transfer) { wait(transfer); }) {}

  const PlanSetup& setup;
  const RankLayout& layout;
  const MicroBatch& micro;
  Timeline timeline;
  PlannedLimiter limiter;
  std::deque<PlannedUnit*> reductions;  // issued, their unsharded gradients not yet freed
  std::vector<PlannedCollective> collectives;
  std::vector<PlannedTransfer> transfers;
  std::vector<bool> waited;  // per transfer: compute has waited for it
  std::vector<PlannedEvent> events;
  bool in_backward = false;

  /// Issues a transfer of `collectives` (none at F = 1; offloaded, the host link still copies).
  /// Returns its index, or -1 when it moves nothing.
  int issue(PlannedTransfer::Kind kind, size_t unit, const std::vector<PlannedCollective>& issued) {
    if (issued.empty() && !setup.policy.fsdp.cpu_offload()) return -1;
    PlannedTransfer transfer{kind, unit, {}};
    for (const auto& c : issued) {
      transfer.collectives.push_back(collectives.size());
      collectives.push_back(c);
    }
    transfers.push_back(std::move(transfer));
    waited.push_back(false);
    events.push_back({PlannedEvent::Issue, transfers.size() - 1});
    return static_cast<int>(transfers.size() - 1);
  }
  /// Compute waits for `transfer` (once: a later wait finds it done).
  void wait(int transfer) {
    if (transfer < 0 || waited[static_cast<size_t>(transfer)]) return;
    waited[static_cast<size_t>(transfer)] = true;
    events.push_back({PlannedEvent::Wait, static_cast<size_t>(transfer)});
  }
  /// The measured iteration starts from `start`: what the first one issued is forgotten.
  void restart(Timeline start) {
    timeline = std::move(start);
    collectives.clear();
    transfers.clear();
    waited.clear();
    events.clear();
  }
};

// A unit as the conductor drives it, counting what a ParamGroup would allocate and send, in the
// engine's order inside a unit (order_: [Note: one order inside a unit]).
class PlannedUnit final : public ScheduledUnit, private UnitMoments {
 public:
  PlannedUnit(StepCounts& step, StepConductor& conductor, size_t index)
      : step_(step), index_(index), unit_(step.layout.units[index]), order_(*this, conductor, step.limiter, *this) {}

  bool is_root() const override { return index_ == 0; }
  const std::string& name() const override { return unit_.name; }
  void begin_forward() override { issue_unshard(/*optional=*/false); }
  bool issue_unshard(bool optional) override;
  void wait_unshard() override;
  void end_forward(bool reshard) override {
    if (reshard) this->reshard();
  }
  void begin_backward(bool no_sync) override;
  bool backward_ran() const override { return backward_ran_; }
  void finish_backward() override;

  /// Autograd completed the unit's gradients (ParamGroup::post_backward).
  void post_backward() { order_.gradient_complete(0, /*main=*/true, main_path()); }
  /// The unsharded gradient it holds while accumulating (freed once reduced).
  int64_t unsharded_grad() const;

 private:
  // UnitMoments: the unit's flat groups counted together.
  void issue_gathers() override;
  void wait_gathers() override { wait_unshard(); }
  void allocate_gradients() override;
  void free_params(size_t) override { reshard(); }
  void settle_gradient(size_t, bool counted) override {
    if (!no_sync_) reduce(counted);  // no_sync keeps the unsharded gradient for the next backward
  }

  bool grads_into_shard(const FlatGroupLayout& g) const {
    return g.grads_into_shard && !step_.micro.accumulating();
  }
  /// Where its main flat group's gradient goes (a unit without parameters: nowhere).
  GradientPath main_path() const {
    if (unit_.flats.empty()) return {/*trainable=*/false};
    return {unit_.trainable, grads_into_shard(unit_.flats.front()), step_.micro.full_grads_kept, no_sync_};
  }
  // Gradient shards already hold a sum when the reduction lands (kept by zero_grad, or earlier
  // micro-batches): the reduction adds to it.
  bool gradients_held() const { return step_.setup.policy.gradients_kept || step_.micro.shards_hold_sum; }
  void reshard();
  void reduce(bool counted);
  void free_reduced();
  // Backward allocates a gradient shard that zero_grad freed.
  void allocate_grad_shard(const FlatGroupLayout& g);
  MemoryBreakdown& now() { return step_.timeline.now(); }

  StepCounts& step_;
  size_t index_;
  const UnitLayout& unit_;
  UnitOrder order_;
  bool unsharded_ = false;
  int gather_ = -1;      // the transfer of its all-gathers, until waited for
  int reduction_ = -1;   // the transfer of its reductions, until the end of backward
  int64_t reduce_output_ = 0;  // its reduction's output, held until the reduction is taken as finished
  bool backward_ran_ = false;
  bool no_sync_ = false;
};

bool PlannedUnit::issue_unshard(bool optional) {
  if (unsharded_) return true;
  return order_.unshard(optional, /*needs_slot=*/unit_.needs_unshard);
}

void PlannedUnit::issue_gathers() {
  unsharded_ = true;
  now().unsharded_params += unit_.unsharded_params;
  std::vector<PlannedCollective> gathers;
  for (const FlatGroupLayout& g : unit_.flats) {
    for (auto& c : gather_collectives(step_.setup, step_.layout, index_, g, step_.in_backward)) gathers.push_back(c);
  }
  gather_ = step_.issue(step_.in_backward ? PlannedTransfer::BackwardGather : PlannedTransfer::ForwardGather,
                        index_, gathers);
}

void PlannedUnit::wait_unshard() {
  issue_unshard(/*optional=*/false);
  step_.wait(gather_);
  gather_ = -1;
}

void PlannedUnit::reshard() {
  if (!unsharded_) return;
  unsharded_ = false;
  now().unsharded_params -= unit_.unsharded_params;
  order_.resharded();
}

int64_t PlannedUnit::unsharded_grad() const {
  int64_t bytes = 0;
  for (const FlatGroupLayout& g : unit_.flats) {
    bytes += step_.micro.accumulating() ? g.accumulating_grad : g.unsharded_grad;
  }
  return bytes;
}

void PlannedUnit::allocate_grad_shard(const FlatGroupLayout& g) {
  if (!step_.setup.policy.gradients_kept && !step_.micro.shards_hold_sum) now().sharded_grads += g.grad_shard;
}

void PlannedUnit::begin_backward(bool no_sync) {
  backward_ran_ = true;
  no_sync_ = no_sync;
  order_.begin_backward(main_path());
}

void PlannedUnit::allocate_gradients() {
  if (!step_.micro.full_grads_kept) now().unsharded_grads += unsharded_grad();
  for (const FlatGroupLayout& g : unit_.flats) {
    if (grads_into_shard(g)) allocate_grad_shard(g);
  }
}

// [Note: the plan's reduced gradients]
// A unit's reduction is issued: the unsharded gradients of the units before it are taken as freed
// now (the root's, the last, at once; the end of backward waits for it). That is the plan's timing
// of the lane, not the limiter's promise: the limiter only makes the next unit's slot or gradient
// wait until at most one reduction is in flight, so a reduction may still run through the next
// unit's backward. Its gradient is planned there; so is its output (a shard of the reduce dtype
// before it lands in the gradient shard: mixed precision, or a sum added to the shard from a
// temporary), held in `workspace` from the issue until the reduction is taken as finished (the
// next unit's reduction, or the end of backward), as a communication thread that runs it beside
// the next unit's backward (always, on a CPU; longer when it is starved on a loaded host) keeps
// it. Counted at the issue alone, as before, the grid
// (Planner.PredictedPeakAndBytesMatchTheRunOnEveryRank) read every row with such an output above
// its plan by that shard: 1.049 for full fp32 AC b1 x2 and x4 (W = 2; 1.046 at W = 3, 1.044 at
// W = 4), 1.033-1.039 for the bf16 rows, on an idle or a loaded machine alike, and once 1.11
// beside another build, past both the grid's 10% and --auto's margin (1.087); counted to the
// reduction's end, every row reads at most 1.03 at W = 1-4 under a load of 7 on two cores (the
// accumulating rows 0.91-1.02: below 1 when a reduction ends before the next backward), and a
// starved thread has --auto's margin to itself.
void PlannedUnit::reduce(bool counted) {
  while (!step_.reductions.empty()) step_.reductions.front()->free_reduced();
  int64_t output = 0;
  std::vector<PlannedCollective> reductions;
  for (const FlatGroupLayout& g : unit_.flats) {
    if (!g.trainable) continue;
    if (!grads_into_shard(g)) allocate_grad_shard(g);  // before the task runs
    // A sum in the shard is added to from a temporary.
    output += gradients_held() ? g.accumulating_reduce_output : g.reduce_output;
    for (auto& c : reduce_collectives(step_.setup, step_.layout, index_, g)) reductions.push_back(c);
  }
  reduce_output_ = output;
  now().workspace += output;
  step_.timeline.check(0, "reduction of " + unit_label(unit_));
  if (unit_.trainable) reduction_ = step_.issue(PlannedTransfer::Reduction, index_, reductions);
  if (counted) step_.limiter.reduction_issued(index_, reduction_);
  step_.reductions.push_back(this);
  if (is_root()) free_reduced();
}

void PlannedUnit::free_reduced() {
  auto it = std::find(step_.reductions.begin(), step_.reductions.end(), this);
  if (it == step_.reductions.end()) return;
  step_.reductions.erase(it);
  now().unsharded_grads -= unsharded_grad();
  now().workspace -= reduce_output_;
  reduce_output_ = 0;
}

void PlannedUnit::finish_backward() {
  free_reduced();
  step_.wait(reduction_);
  step_.limiter.reduction_waited(index_);
  reduction_ = -1;
  reshard();
  backward_ran_ = false;
}

// Autograd's part of a step: what each piece of the model saves and frees, and the order in
// which it reaches the units. The conductor does the rest.
class PlannedAutograd {
 public:
  PlannedAutograd(StepCounts& step, StepConductor& conductor, std::vector<std::unique_ptr<PlannedUnit>>& units)
      : step_(step), conductor_(conductor), units_(units), model_(step.setup.model),
        batch_(step.setup.policy.batch), checkpointing_(step.setup.policy.fsdp.activation_checkpointing()) {}

  void forward();
  void backward();

 private:
  const PlanActivations& activations(size_t u) const { return model_.units[u - 1].activations; }
  Timeline& t() { return step_.timeline; }
  std::vector<ScheduledUnit*> scheduled() const {
    std::vector<ScheduledUnit*> out;
    for (const auto& unit : units_) out.push_back(unit.get());
    return out;
  }

  StepCounts& step_;
  StepConductor& conductor_;
  std::vector<std::unique_ptr<PlannedUnit>>& units_;
  const PlanModel& model_;
  int64_t batch_;
  bool checkpointing_;
};

void PlannedAutograd::forward() {
  step_.in_backward = false;
  PlannedUnit& root = *units_[0];
  conductor_.pre_forward(root);
  t().check(batch_ * model_.root_pre.forward_transient, "forward of the root (before the units)");
  t().now().activations += batch_ * model_.root_pre.saved;
  for (size_t u = 1; u < units_.size(); ++u) {
    conductor_.pre_forward(*units_[u]);
    step_.events.push_back({PlannedEvent::Forward, u});
    const PlanActivations& a = activations(u);
    // Under checkpointing nothing is saved, but the intermediates exist while it runs: at most
    // what it would have saved.
    const int64_t running = a.forward_transient + (checkpointing_ ? a.saved - a.checkpointed : 0);
    t().check(batch_ * running, "forward of " + unit_label(step_.layout.units[u]));
    t().now().activations += batch_ * (checkpointing_ ? a.checkpointed : a.saved);
    conductor_.post_forward(*units_[u], /*training=*/true, /*will_backward=*/true);
  }
  const PlanActivations& head = model_.root.activations;
  step_.events.push_back({PlannedEvent::Forward, 0});
  t().check(batch_ * head.forward_transient, "forward of the root (after the units)");
  t().now().activations += batch_ * head.saved;
  conductor_.post_forward(root, /*training=*/true, /*will_backward=*/true);
}

void PlannedAutograd::backward() {
  step_.in_backward = true;
  const size_t last = units_.size() - 1;
  PlannedUnit& root = *units_[0];
  conductor_.backward_reached(root);
  step_.events.push_back({PlannedEvent::Backward, 0});
  const PlanActivations& head = model_.root.activations;
  t().check(batch_ * head.backward_transient + model_.root.backward_workspace,
            "backward of the root (before the units)");
  // The head frees what it saved and the last unit's output (its input).
  t().now().activations -= batch_ * (head.saved + (last >= 1 ? activations(last).checkpointed : 0));
  for (size_t u = last; u >= 1; --u) {
    conductor_.backward_reached(*units_[u]);
    step_.events.push_back({PlannedEvent::Backward, u});
    const PlanActivations& a = activations(u);
    if (checkpointing_) t().now().activations += batch_ * a.saved;  // recomputed
    t().check(batch_ * a.backward_transient + model_.units[u - 1].backward_workspace,
              "backward of " + unit_label(step_.layout.units[u]));
    // Freed: what it saved but its output (gone with the unit after it: checkpointed, the
    // recomputed copy too), and its input, the unit before it's output.
    t().now().activations -= batch_ * (checkpointing_ ? a.saved : a.saved - a.checkpointed);
    if (u > 1) t().now().activations -= batch_ * activations(u - 1).checkpointed;
    units_[u]->post_backward();
  }
  t().check(batch_ * model_.root_pre.backward_transient + model_.root.backward_workspace,
            "backward of the root (after the units)");
  root.post_backward();
  // Every gradient shard, until zero_grad frees them.
  if (!step_.micro.last) {
    t().check(0, "the end of backward");
  } else if (step_.layout.optimizer_workspace == 0) {
    t().check(0, "the optimizer step");
  } else {  // Muon's exchange and iteration ([Note: Muon in the plan])
    t().check(step_.layout.optimizer_workspace, "the optimizer step (Muon: " + step_.layout.optimizer_workspace_at + ")");
  }
  conductor_.finish_backward(scheduled());
}

}  // namespace

PlannedStep run_planned_step(const PlanSetup& setup, const RankLayout& layout, const MicroBatch& micro,
                             const MemoryBreakdown& start, const std::string& suffix) {
  StepCounts step(setup, layout, micro, Timeline(start, suffix));
  StepListener model_wide;  // the published shards and autograd's callback: nothing to count
  StepConductor conductor(setup.policy.fsdp, model_wide);
  conductor.set_no_sync(!micro.reduces);
  std::vector<std::unique_ptr<PlannedUnit>> units;
  for (size_t u = 0; u < layout.units.size(); ++u) units.push_back(std::make_unique<PlannedUnit>(step, conductor, u));
  PlannedAutograd autograd(step, conductor, units);
  // The first iteration records the forward order that forward prefetch follows.
  autograd.forward();
  autograd.backward();
  step.restart(Timeline(start, suffix));
  autograd.forward();
  autograd.backward();
  return {step.timeline, std::move(step.collectives), std::move(step.transfers), std::move(step.events)};
}

}  // namespace fsdp::planning
