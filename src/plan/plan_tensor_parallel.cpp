#include "plan/plan_tensor_parallel.h"

#include "plan/plan_bounds.h"

#include <fsdp/checked_math.h>

#include <c10/util/Exception.h>

namespace fsdp::planning {

namespace {

// Ring steps of one collective over T ranks (latency): T-1, an all-reduce twice that.
int64_t ring_steps(const PlanTpCollective& c, int t) {
  return c.kind == PlanTpCollective::AllReduce ? 2 * (t - 1) : t - 1;
}

int64_t must_count(std::optional<int64_t> bytes) {
  TORCH_CHECK(bytes, "plan: the model's tensor-parallel collectives send more bytes per step than "
              "int64 counts; describe the model's real sizes");
  return *bytes;
}

// A frozen replicated parameter has no gradient to sum.
bool sums_a_frozen_gradient(const PlanUnit& unit, const PlanTpCollective& c) {
  if (c.parameter.empty()) return false;
  for (const PlanParam& p : unit.params) {
    if (p.name == c.parameter) return !p.requires_grad;
  }
  return false;
}

// Each split parameter's tp_dim names one of its dimensions; a description for --tp T that says
// nothing is split would plan Muon's exchange of the parts as if every matrix were whole.
void check_tp_dims(const PlanModel& model, bool muon) {
  bool any_split = false;
  for (const PlanUnit* unit : units_of(model)) {
    for (const PlanParam& p : unit->params) {
      TORCH_CHECK(p.tp_dim >= -1 && p.tp_dim < static_cast<int64_t>(p.shape.size()), "plan: parameter '", p.name,
                  "' has tp_dim ", p.tp_dim, " but ", p.shape.size(), " dimensions; give the dimension tensor "
                  "parallelism splits (0-based), or -1 for a replicated parameter");
      any_split = any_split || p.tp_dim >= 0;
    }
  }
  TORCH_CHECK(any_split || !muon, "plan: Muon with the model is described for --tp ", model.tp_size, " but no parameter says which "
              "dimension tensor parallelism splits (tp_dim); describe each split parameter's part and its tp_dim");
}

}  // namespace

bool tp_spans_hosts(const PlanWorld& world, int tp_size) { return tp_size > world.ranks_per_host; }

void validate_tensor_parallel(const PlanSetup& setup) {
  const int t = setup.policy.tp_size, w = setup.world.world_size, rph = setup.world.ranks_per_host;
  TORCH_CHECK(t >= 1, "plan: --tp must be >= 1, got ", t);
  TORCH_CHECK(setup.model.tp_size == t, "plan: the model was described for --tp ", setup.model.tp_size,
              " but the policy runs --tp ", t, "; describe the model for the policy's TP size");
  if (t == 1) return;
  TORCH_CHECK(w % t == 0, "plan: --tp ", t, " does not divide the world size ", w, " (--ranks): each TP "
              "group is ", t, " ranks; choose a --tp that divides it");
  TORCH_CHECK(rph >= 1 && (rph % t == 0 || t % rph == 0), "plan: --tp ", t, " and --ranks-per-host ", rph,
              ": a TP group would straddle two hosts (TP groups are consecutive ranks); choose a --tp "
              "that divides the ranks per host (or a multiple of them)");
  check_tp_dims(setup.model, setup.policy.optimizer.name == "Muon");
}

PlanSetup data_parallel_setup(const PlanSetup& setup) {
  const int t = setup.policy.tp_size;
  if (t == 1) return setup;
  PlanSetup dp = setup;
  dp.world.world_size = setup.world.world_size / t;
  dp.world.ranks_per_host = tp_spans_hosts(setup.world, t) ? 1 : setup.world.ranks_per_host / t;
  return dp;
}

// Each unit's collectives as the step issues them: forward's per sequence of the batch (again
// when activation checkpointing recomputes a unit's forward; the root is not checkpointed),
// backward's, and the per-micro-batch all-reduces of replicated gradients; every micro-batch.
TensorParallelStep tensor_parallel_step(const PlanSetup& setup) {
  TensorParallelStep step;
  const int t = setup.policy.tp_size;
  if (t == 1) return step;
  const PlanLinks& links = setup.links;
  const bool across = tp_spans_hosts(setup.world, t);
  const double bandwidth = across ? links.cross_host_bandwidth : links.intra_host_bandwidth;
  const bool checkpointing = setup.policy.fsdp.activation_checkpointing();
  PlanTraffic& traffic = step.traffic;
  const std::vector<const PlanUnit*> units = units_of(setup.model);
  for (size_t u = 0; u < units.size(); ++u) {
    for (const PlanTpCollective& c : units[u]->tp_collectives) {
      if (sums_a_frozen_gradient(*units[u], c)) continue;
      const int64_t runs = !c.backward && checkpointing && u > 0 ? 2 : 1;
      const int64_t calls = must_count(checked_mul(runs, setup.policy.micro_batches));
      const int64_t per_call = c.per_sequence ? must_count(checked_mul(c.bytes, setup.policy.batch)) : c.bytes;
      const int64_t bytes = must_count(checked_mul(per_call, calls));
      int64_t& kind = c.kind == PlanTpCollective::AllGather       ? traffic.tp_all_gather
                      : c.kind == PlanTpCollective::ReduceScatter ? traffic.tp_reduce_scatter
                                                                  : traffic.tp_all_reduce;
      kind = must_count(checked_add(kind, bytes));
      int64_t& link = across ? traffic.cross_host : traffic.intra_host;
      link = must_count(checked_add(link, bytes));
      traffic.collectives += calls;
      step.seconds += (bandwidth > 0 ? static_cast<double>(bytes) / bandwidth : 0) +
                      static_cast<double>(calls * ring_steps(c, t)) * links.latency_s;
    }
  }
  return step;
}

}  // namespace fsdp::planning
