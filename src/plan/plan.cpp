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
         activations + workspace + program + staging;
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

// What each world rank's Muon exchange sends ([Note: Muon in the plan]): every rank's bytes, the
// busiest's collectives (the exchange ends when it is done) and the mean traffic.
struct MuonExchanges {
  std::vector<int64_t> by_rank;
  std::vector<planning::PlannedCollective> busiest;
  int busiest_rank = -1;
  PlanTraffic sum;
  void add(const PlanSetup& setup, int world_rank, int64_t sent, std::vector<planning::PlannedCollective> exchange) {
    by_rank.resize(std::max(by_rank.size(), static_cast<size_t>(world_rank) + 1), 0);
    by_rank[static_cast<size_t>(world_rank)] = sent;
    if (busiest_rank < 0 || sent > by_rank[static_cast<size_t>(busiest_rank)]) {
      busiest_rank = world_rank;
      busiest = exchange;
    }
    const PlanTraffic t = planning::total_traffic(setup, exchange);
    sum.all_to_all += t.all_to_all;
    sum.all_reduce += t.all_reduce;
    sum.intra_host += t.intra_host;
    sum.cross_host += t.cross_host;
    sum.collectives = std::max(sum.collectives, t.collectives);
  }
  double mean(int64_t total) const { return by_rank.empty() ? 0 : static_cast<double>(total) / by_rank.size(); }
  // The mean rank's Muon traffic, added to `traffic`.
  void add_mean_to(PlanTraffic& traffic) const {
    traffic.all_to_all += std::llround(mean(sum.all_to_all));
    traffic.all_reduce += std::llround(mean(sum.all_reduce));
    traffic.intra_host += std::llround(mean(sum.intra_host));
    traffic.cross_host += std::llround(mean(sum.cross_host));
    traffic.collectives += sum.collectives;
  }
};

// Muon's costs, for the report (each is in the plan's totals already).
void summarize_muon(const PlanSetup& setup, const planning::MuonOwners& owners, const planning::MuonRankWork& rank0,
                    const MuonExchanges& exchanges, PlanMuon& muon) {
  for (const auto& m : owners.matrices) {
    ++muon.matrices;
    muon.matrix_elements += m.rows * m.cols;
  }
  muon.total_flops = owners.total_flops();
  muon.momentum_bytes = rank0.momentum_bytes;
  muon.busiest_flops = owners.busiest_flops();
  muon.newton_schulz_s = planning::newton_schulz_seconds(setup, owners);
  muon.all_to_all_by_rank = exchanges.by_rank;
  muon.all_to_all_busiest_rank = std::max(exchanges.busiest_rank, 0);
  muon.all_to_all_busiest = exchanges.by_rank.empty() ? 0 : exchanges.by_rank[muon.all_to_all_busiest_rank];
  muon.all_to_all_mean = exchanges.mean(exchanges.sum.all_to_all);
  for (const auto& c : exchanges.busiest) muon.all_to_all_s += planning::collective_seconds(c, setup.links);
}

// TP's bytes, apart from FSDP's, and its time, all exposed; ranks named by their world rank
// (data-parallel rank d at tp index i is world rank d*T + i: plan() names them).
void add_tensor_parallel(const PlanSetup& setup, Plan& plan) {
  const int t = setup.policy.tp_size;
  if (t == 1) return;
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
  const int t = full_setup.policy.tp_size;
  const int shard_group = setup.policy.fsdp.shard_group_size_for(setup.world.world_size, setup.world.ranks_per_host);
  const planning::MuonOwners owners = planning::muon_owners(setup, shard_group);
  const bool muon = planning::plans_muon(setup.policy.optimizer);
  MuonExchanges exchanges;
  planning::MuonRankWork rank0_muon;
  std::optional<planning::RankLayout> rank0;
  for (int rank = 0; rank < setup.world.world_size; ++rank) {
    planning::RankLayout layout = planning::layout_for_rank(setup, rank);
    // Under TP the members of a tp group differ in Muon's work only: the rank is its busiest.
    int named = rank * t;
    for (int index = 0; index < (muon ? t : 1); ++index) {
      const planning::MuonRankWork work = planning::muon_rank_work(setup, layout, owners, index);
      if (muon) exchanges.add(setup, rank * t + index, work.sent(), planning::muon_collectives(setup, full_setup.world, layout, work));
      if (rank == 0 && index == 0) rank0_muon = work;
      if (index == 0 || work.workspace > layout.optimizer_workspace) {
        layout.optimizer_workspace = work.workspace;
        layout.optimizer_workspace_at = work.workspace_at;
        named = rank * t + index;
      }
    }
    if (layout.optimizer_workspace > result.muon.workspace) {
      result.muon.workspace = layout.optimizer_workspace;
      result.muon.workspace_rank = named;
      result.muon.workspace_at = layout.optimizer_workspace_at;
    }
    RankMemory memory = planning::replay_step_memory(setup, layout);
    memory.rank = named;
    result.peak_bytes = std::max(result.peak_bytes, memory.peak.total());
    result.ranks.push_back(std::move(memory));
    if (rank == 0) {
      result.shard_group_size = layout.shard_group_size;
      result.replicas = layout.replicas;
      rank0 = std::move(layout);
    }
  }
  // One micro-batch as the conductor runs it on rank 0: its collectives and their overlap; then
  // the collectives waited for at the step's end (the program's own, Muon's exchange: the
  // busiest rank's, which the others wait for).
  const planning::PlannedStep step = planning::run_planned_step(setup, *rank0, planning::MicroBatch{}, {}, "");
  auto at_the_end = planning::program_collectives(full_setup);  // the loss: over every rank
  std::vector<planning::PlannedCollective> collectives = step.collectives;
  collectives.insert(collectives.end(), at_the_end.begin(), at_the_end.end());
  result.traffic = planning::total_traffic(setup, collectives);
  exchanges.add_mean_to(result.traffic);
  at_the_end.insert(at_the_end.end(), exchanges.busiest.begin(), exchanges.busiest.end());
  result.time = planning::step_time(setup, *rank0, step, at_the_end, planning::newton_schulz_seconds(setup, owners));
  if (muon) summarize_muon(setup, owners, rank0_muon, exchanges, result.muon);
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
