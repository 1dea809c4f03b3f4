#include "plan/plan_time.h"

#include "plan/plan_optimizer.h"
#include "plan/planned_step.h"

#include <algorithm>

namespace fsdp::planning {

namespace {

double seconds(double value, double rate) { return rate > 0 ? value / rate : 0; }


// FSDP's own work per unit: the shard copied into the unsharded buffer (a cast in mixed
// precision), each gradient copied into the unsharded gradient.
double fsdp_copy_seconds(const UnitLayout& unit, const RankLayout& layout, const KernelRates& r) {
  const double gather_copy = 2.0 * unit.shard_numel * layout.precision.shard_bytes;
  const double grad_copy = 2.0 * unit.numel * layout.precision.reduce_bytes;
  return seconds(gather_copy + grad_copy, r.memory_bandwidth);
}

// CPU offload ([Note: offloaded copies], fsdp::optim::StepInBackward): each gather brings the
// fp32 shard up and each reduction takes the fp32 gradient shard down over the host link (on the
// communication lane, with the unit's collectives); the optimizer runs on the host, each unit as
// its gradient lands, so it overlaps the backward of the units after it; the root, reduced last,
// is stepped after backward.
double offload_copy_seconds(const PlanSetup& setup, const RankLayout& layout, const UnitLayout& unit) {
  if (!setup.policy.fsdp.cpu_offload()) return 0;
  return seconds(static_cast<double>(unit.shard_numel * layout.precision.shard_bytes), setup.device.host_link_bandwidth);
}

// What the optimizer's element-wise pass over `unit`'s trainable pieces reads and writes.
int64_t optimizer_step_bytes(const PlanSetup& setup, const RankLayout& layout, const UnitLayout& unit) {
  return optimizer_totals(setup.policy.optimizer, unit.trainable_piece_numel, unit.muon_piece_numel,
                          layout.precision.shard_bytes)
      .step;
}

double offload_optimizer_exposed(const PlanSetup& setup, const RankLayout& layout, double backward_compute) {
  double exposed = 0, overlapped = 0;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const double step = seconds(static_cast<double>(optimizer_step_bytes(setup, layout, layout.units[u])),
                                setup.device.host_memory_bandwidth);
    (u == 0 ? exposed : overlapped) += step;
  }
  return exposed + std::max(0.0, overlapped - backward_compute);
}

double transfer_seconds(const PlannedTransfer& transfer, const PlannedStep& step, const PlanSetup& setup,
                        const RankLayout& layout) {
  double s = offload_copy_seconds(setup, layout, layout.units[transfer.unit]);
  for (size_t c : transfer.collectives) s += collective_seconds(step.collectives[c], setup.links);
  return s;
}

}  // namespace

// One unit's forward and backward: each kind of its work at the device's rate for it (rates of a
// forward and its backward together: the forward is a third); with activation checkpointing a
// second forward first.
UnitSeconds unit_seconds(const PlanUnit& unit, const PlanSetup& setup, const KernelRates& r, bool is_root) {
  const double b = static_cast<double>(setup.policy.batch);
  const double forward_and_backward =
      3 * seconds(unit.forward_flops * b, r.matmul_flops) +
      3 * seconds(unit.forward_attention_flops * b, r.attention_flops) +
      seconds(unit.forward_transcendentals * b, r.transcendentals) +
      3 * seconds(unit.forward_memory_bytes * b, r.memory_bandwidth) +
      3 * unit.forward_ops * setup.device.op_overhead_s;
  const double forward = forward_and_backward / 3;
  const bool recompute = setup.policy.fsdp.activation_checkpointing() && !is_root;
  return {forward, (recompute ? 3.0 : 2.0) * forward};
}

double collective_seconds(const PlannedCollective& c, const PlanLinks& links) {
  const double bandwidth = c.spans_hosts() ? links.cross_host_bandwidth : links.intra_host_bandwidth;
  return seconds(static_cast<double>(c.bytes), bandwidth) + c.steps * links.latency_s;
}

// The planned step's events replayed on two clocks: compute runs its units' forward and backward
// in order and waits where the step waited; the communication lane runs each transfer from when
// it is issued (or the lane is free) for its time. What compute waited is the exposed
// communication: prefetch hides exactly what the conductor issued early.
PlanTime step_time(const PlanSetup& setup, const RankLayout& layout, const PlannedStep& step,
                   const std::vector<PlannedCollective>& program, double newton_schulz) {
  const PlanModel& model = setup.model;
  const KernelRates& rates = layout.precision.compute_bytes < 4 ? setup.device.low_precision : setup.device.fp32;
  const size_t n = layout.units.size();
  std::vector<UnitSeconds> unit(n);
  unit[0] = unit_seconds(model.root, setup, rates, true);
  for (size_t u = 1; u < n; ++u) unit[u] = unit_seconds(model.units[u - 1], setup, rates, false);

  PlanTime t;
  double passes = 0, backward_compute = 0;
  int64_t step_bytes = 0, tensors = 0;
  for (size_t u = 0; u < n; ++u) {
    passes += unit[u].forward + unit[u].backward;
    backward_compute += unit[u].backward;
    t.compute += fsdp_copy_seconds(layout.units[u], layout, rates);
    step_bytes += optimizer_step_bytes(setup, layout, layout.units[u]);
    tensors += layout.units[u].param_tensors;
  }
  t.compute += passes;
  // The optimizer reads a parameter, its gradient and its state and writes all but the gradient
  // back (AdamW: 7 elements' worth): on the device, or offloaded on the host (the part backward
  // does not hide). Muon's owners orthogonalize their matrices besides ([Note: Muon in the plan]).
  t.compute += (setup.policy.fsdp.cpu_offload()
                    ? offload_optimizer_exposed(setup, layout, backward_compute)
                    : seconds(static_cast<double>(step_bytes), setup.device.fp32.memory_bandwidth)) +
               tensors * setup.device.op_overhead_s + newton_schulz;

  std::vector<double> done(step.transfers.size(), 0);
  double compute = 0, lane = 0;
  for (const PlannedEvent& e : step.events) {
    switch (e.kind) {
      case PlannedEvent::Forward: compute += unit[e.index].forward; break;
      case PlannedEvent::Backward: compute += unit[e.index].backward; break;
      case PlannedEvent::Issue: {
        const double s = transfer_seconds(step.transfers[e.index], step, setup, layout);
        t.communication += s;
        lane = done[e.index] = std::max(compute, lane) + s;
        break;
      }
      case PlannedEvent::Wait: compute = std::max(compute, done[e.index]); break;
    }
  }
  t.exposed_communication = compute - passes;
  for (const auto& c : program) {  // the program's own (the loss), Muon's exchange: at the step's end
    const double s = collective_seconds(c, setup.links);
    t.communication += s;
    t.exposed_communication += s;
  }
  t.step = t.compute + t.exposed_communication;
  const double tokens = static_cast<double>(setup.world.world_size) * setup.policy.batch * model.sequence_tokens;
  t.tokens_per_s = t.step > 0 ? tokens / t.step : 0;
  return t;
}

}  // namespace fsdp::planning
