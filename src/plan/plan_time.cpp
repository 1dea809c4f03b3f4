#include "plan/plan_time.h"

#include "plan/plan_optimizer.h"

#include <algorithm>

namespace fsdp::planning {

namespace {

struct UnitSeconds {
  double forward = 0, backward = 0;
};

double seconds(double value, double rate) { return rate > 0 ? value / rate : 0; }

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

// FSDP's own work per unit: the shard copied into the unsharded buffer (a cast in mixed
// precision), each gradient copied into the unsharded gradient.
double fsdp_copy_seconds(const UnitLayout& unit, const RankLayout& layout, const KernelRates& r) {
  const double gather_copy = 2.0 * unit.shard_numel * layout.precision.shard_bytes;
  const double grad_copy = 2.0 * unit.numel * layout.precision.reduce_bytes;
  return seconds(gather_copy + grad_copy, r.memory_bandwidth);
}

// CPU offload ([Note: offloaded copies], fsdp::optim::StepInBackward): each gather brings the
// fp32 shard up and each reduction takes the fp32 gradient shard down over the host link (hidden
// like the unit's collectives); the optimizer runs on the host, each unit as its gradient lands,
// so it overlaps the backward of the units after it; the root, reduced last, is stepped after
// backward.
struct OffloadSeconds {
  std::vector<double> forward_copies, backward_copies;
  double optimizer_exposed = 0;
};

OffloadSeconds offload_seconds(const PlanSetup& setup, const RankLayout& layout, double backward_compute) {
  const size_t n = layout.units.size();
  OffloadSeconds o{std::vector<double>(n, 0), std::vector<double>(n, 0), 0};
  double optimizer_overlapped = 0;
  const OptimizerBytes optimizer = optimizer_bytes(setup.policy.optimizer, layout.precision.shard_bytes);
  for (size_t u = 0; u < n; ++u) {
    const UnitLayout& unit = layout.units[u];
    const double copy = seconds(static_cast<double>(unit.shard_numel * layout.precision.shard_bytes),
                                setup.device.host_link_bandwidth);
    o.forward_copies[u] = copy;
    o.backward_copies[u] = (u > 0 && unit.reshard_after_forward ? copy : 0) + (unit.trainable ? copy : 0);
    const double step = seconds(static_cast<double>(unit.piece_numel * optimizer.step_per_element),
                                setup.device.host_memory_bandwidth);
    (u == 0 ? o.optimizer_exposed : optimizer_overlapped) += step;
  }
  o.optimizer_exposed += std::max(0.0, optimizer_overlapped - backward_compute);
  return o;
}

double collective_seconds(const PlannedCollective& c, const PlanLinks& links) {
  const double bandwidth = c.spans_hosts() ? links.cross_host_bandwidth : links.intra_host_bandwidth;
  return seconds(static_cast<double>(c.bytes), bandwidth) + c.steps * links.latency_s;
}

}  // namespace

PlanTime step_time(const PlanSetup& setup, const RankLayout& layout,
                   const std::vector<PlannedCollective>& collectives) {
  const PlanModel& model = setup.model;
  const KernelRates& rates = layout.precision.compute_bytes < 4 ? setup.device.low_precision : setup.device.fp32;
  const size_t n = layout.units.size();
  std::vector<UnitSeconds> unit(n);
  unit[0] = unit_seconds(model.root, setup, rates, true);
  for (size_t u = 1; u < n; ++u) unit[u] = unit_seconds(model.units[u - 1], setup, rates, false);

  PlanTime t;
  for (size_t u = 0; u < n; ++u) {
    t.compute += unit[u].forward + unit[u].backward + fsdp_copy_seconds(layout.units[u], layout, rates);
  }
  int64_t pieces = 0, tensors = 0;
  for (const auto& u : layout.units) {
    pieces += u.piece_numel;
    tensors += u.param_tensors;
  }
  const bool offload = setup.policy.fsdp.cpu_offload();
  double backward_compute = 0;
  for (size_t u = 0; u < n; ++u) backward_compute += unit[u].backward;
  const OffloadSeconds copies = offload ? offload_seconds(setup, layout, backward_compute) : OffloadSeconds{
      std::vector<double>(n, 0), std::vector<double>(n, 0), 0};
  // The optimizer reads a parameter, its gradient and its state and writes all but the gradient
  // back (AdamW: 7 elements' worth): on the device, or offloaded on the host (the part backward
  // does not hide).
  const OptimizerBytes optimizer = optimizer_bytes(setup.policy.optimizer, layout.precision.shard_bytes);
  t.compute += (offload ? copies.optimizer_exposed
                        : seconds(static_cast<double>(pieces * optimizer.step_per_element),
                                  setup.device.fp32.memory_bandwidth)) +
               tensors * setup.device.op_overhead_s;

  // Communication per unit and direction; what the compute it overlaps does not cover shows.
  std::vector<double> forward_comm = copies.forward_copies, backward_comm = copies.backward_copies;
  for (double s : forward_comm) t.communication += s;
  for (double s : backward_comm) t.communication += s;
  for (const auto& c : collectives) {
    const double s = collective_seconds(c, setup.links);
    t.communication += s;
    (c.backward ? backward_comm : forward_comm)[c.unit] += s;
  }
  const bool forward_prefetch = setup.policy.fsdp.forward_prefetch();
  const bool backward_prefetch = setup.policy.fsdp.backward_prefetch() != BackwardPrefetch::None;
  // Forward: unit u's all-gather runs during unit u-1's forward (the root's is never hidden).
  t.exposed_communication += forward_comm[0];
  for (size_t u = 1; u < n; ++u) {
    const double hidden_by = forward_prefetch ? unit[u - 1].forward : 0;
    t.exposed_communication += std::max(0.0, forward_comm[u] - hidden_by);
  }
  // Backward: unit u's gather and reduction run during the backward of its neighbour.
  for (size_t u = n - 1; u >= 1; --u) {
    const double hidden_by = backward_prefetch ? unit[u - 1].backward : 0;
    t.exposed_communication += std::max(0.0, backward_comm[u] - hidden_by);
  }
  t.exposed_communication += backward_comm[0];  // the root's reduction ends the backward
  t.step = t.compute + t.exposed_communication;
  const double tokens = static_cast<double>(setup.world.world_size) * setup.policy.batch * model.sequence_tokens;
  t.tokens_per_s = t.step > 0 ? tokens / t.step : 0;
  return t;
}

}  // namespace fsdp::planning
