#include <fsdp/plan.h>

#include "plan/plan_bounds.h"
#include "plan/plan_layout.h"
#include "plan/plan_memory.h"
#include "plan/plan_muon.h"
#include "plan/plan_tensor_parallel.h"
#include "plan/plan_time.h"
#include "plan/plan_traffic.h"
#include "plan/planned_step.h"

#include <fsdp/checked_math.h>

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>
#include <sstream>

namespace fsdp {

int64_t PlanParam::numel() const {
  const auto n = checked_product(shape);
  TORCH_CHECK(n, "plan: parameter '", name, "' has more elements than int64 counts (a dimension of ",
              "its shape is absurd); describe the model's real sizes");
  return *n;
}

int64_t PlanModel::numel() const {
  std::optional<int64_t> n = 0;
  for (const PlanUnit* unit : planning::units_of(*this)) {
    for (const auto& p : unit->params) {
      if (n) n = checked_add(*n, p.numel());
    }
  }
  TORCH_CHECK(n, "plan: the model has more parameter elements than int64 counts; describe the "
              "model's real sizes");
  return *n;
}

int64_t MemoryBreakdown::total() const {
  return sharded_params + sharded_grads + optimizer_state + unsharded_params + unsharded_grads +
         activations + workspace + program;
}

std::string Plan::label() const {
  const FullyShardOptions& o = setup.policy.fsdp;
  std::ostringstream s;
  s << to_string(o.strategy()) << " F=" << shard_group_size;
  if (setup.policy.tp_size > 1) s << " TP=" << setup.policy.tp_size;
  if (o.mixed_precision().param_dtype()) s << " " << c10::toString(*o.mixed_precision().param_dtype());
  if (o.activation_checkpointing()) s << " AC";
  if (o.cpu_offload()) s << " offload";
  s << " batch " << setup.policy.batch;
  if (setup.policy.micro_batches > 1) {
    s << " x " << setup.policy.micro_batches << " micro-batches" << (setup.policy.no_sync ? " no_sync" : "");
  }
  return s.str();
}

namespace {

// Rank 0's Muon costs, for the report (each is in the plan's totals already).
void summarize_muon(const PlanSetup& setup, const planning::MuonOwners& owners, const planning::MuonRankWork& work,
                    const std::vector<planning::PlannedCollective>& exchange, PlanMuon& muon) {
  for (const auto& m : owners.matrices) {
    ++muon.matrices;
    muon.matrix_elements += m.rows * m.cols;
    muon.total_flops += m.flops;
  }
  muon.momentum_bytes = work.momentum_bytes;
  muon.busiest_flops = owners.busiest_flops();
  muon.newton_schulz_s = planning::newton_schulz_seconds(setup, owners);
  for (const auto& c : exchange) {
    muon.all_to_all_bytes += c.bytes;
    muon.all_to_all_s += planning::collective_seconds(c, setup.links);
  }
}

// TP's bytes, apart from FSDP's, and its time, all exposed; ranks named by their world rank
// (data-parallel rank d is world rank d*T, TP index 0: every TP rank holds the same).
void add_tensor_parallel(const PlanSetup& setup, Plan& plan) {
  const int t = setup.policy.tp_size;
  if (t == 1) return;
  for (RankMemory& rank : plan.ranks) rank.rank *= t;
  plan.muon.workspace_rank *= t;
  plan.tp_spans_hosts = planning::tp_spans_hosts(setup.world, t);
  const planning::TensorParallelStep tp = planning::tensor_parallel_step(setup);
  PlanTraffic& traffic = plan.traffic;
  traffic.tp_all_gather = tp.traffic.tp_all_gather;
  traffic.tp_reduce_scatter = tp.traffic.tp_reduce_scatter;
  traffic.tp_all_reduce = tp.traffic.tp_all_reduce;
  traffic.intra_host += tp.traffic.intra_host;
  traffic.cross_host += tp.traffic.cross_host;
  traffic.collectives += tp.traffic.collectives;
  PlanTime& time = plan.time;
  time.tensor_parallel = tp.seconds;
  time.communication += tp.seconds;
  time.exposed_communication += tp.seconds;
  time.step = time.compute + time.exposed_communication;
  const double tokens = static_cast<double>(setup.world.world_size / t) * static_cast<double>(setup.policy.batch) *
                        static_cast<double>(setup.model.sequence_tokens);
  time.tokens_per_s = time.step > 0 ? tokens / time.step : 0;
}

}  // namespace

// With tensor parallelism the FSDP part is the plan of the data-parallel world over the TP-local
// model ([Note: tensor parallelism in the plan]); TP's bytes and time are added to it.
Plan plan(const PlanSetup& full_setup) {
  planning::validate_tensor_parallel(full_setup);
  const PlanSetup setup = planning::data_parallel_setup(full_setup);
  planning::validate_setup(setup);
  planning::check_plan_bounds(setup);
  Plan result;
  // Muon's owners: the same in every shard group, chosen once.
  const int shard_group = setup.policy.fsdp.shard_group_size_for(setup.world.world_size, setup.world.ranks_per_host);
  const planning::MuonOwners owners = planning::muon_owners(setup, shard_group);
  for (int rank = 0; rank < setup.world.world_size; ++rank) {
    planning::RankLayout layout = planning::layout_for_rank(setup, rank);
    const planning::MuonRankWork muon = planning::muon_rank_work(setup, layout, owners);
    layout.optimizer_workspace = muon.workspace;
    layout.optimizer_workspace_at = muon.workspace_at;
    if (muon.workspace > result.muon.workspace) {
      result.muon.workspace = muon.workspace;
      result.muon.workspace_rank = rank;
      result.muon.workspace_at = muon.workspace_at;
    }
    RankMemory memory = planning::replay_step_memory(setup, layout);
    result.peak_bytes = std::max(result.peak_bytes, memory.peak.total());
    result.ranks.push_back(std::move(memory));
    if (rank == 0) {
      result.shard_group_size = layout.shard_group_size;
      result.replicas = layout.replicas;
      // One micro-batch as the conductor runs it: its collectives and their overlap; then the
      // collectives waited for at the step's end (the program's own, Muon's exchange).
      const planning::PlannedStep step = planning::run_planned_step(setup, layout, planning::MicroBatch{}, {}, "");
      auto at_the_end = planning::program_collectives(full_setup);  // the loss: over every rank
      const auto exchange = planning::muon_collectives(setup, layout, muon);
      at_the_end.insert(at_the_end.end(), exchange.begin(), exchange.end());
      std::vector<planning::PlannedCollective> collectives = step.collectives;
      collectives.insert(collectives.end(), at_the_end.begin(), at_the_end.end());
      result.traffic = planning::total_traffic(setup, collectives);
      result.time = planning::step_time(setup, layout, step, at_the_end, planning::newton_schulz_seconds(setup, owners));
      summarize_muon(setup, owners, muon, exchange, result.muon);
    }
  }
  add_tensor_parallel(full_setup, result);
  result.setup = full_setup;
  const double memory = setup.device.memory_bytes;
  if (memory > 0) {
    result.headroom = 1.0 - static_cast<double>(result.peak_bytes) / memory;
    result.fits = result.headroom >= 0;
    result.at_risk = result.fits && result.headroom < setup.device.allocator_reserve;
  }
  if (setup.device.host_memory_bytes > 0) {
    for (const auto& rank : result.ranks) {
      if (static_cast<double>(rank.offloaded_bytes) > setup.device.host_memory_bytes) result.host_fits = false;
    }
    result.fits = result.fits && result.host_fits;
  }
  return result;
}

}  // namespace fsdp
