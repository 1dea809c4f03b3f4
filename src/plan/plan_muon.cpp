#include "plan/plan_muon.h"

#include <fsdp/muon.h>

#include "optim/muon_owners.h"
#include "optim/muon_phases.h"
#include "optim/newton_schulz.h"

#include <algorithm>
#include <numeric>

namespace fsdp::planning {

namespace {

constexpr int64_t kBf16 = 2;  // bytes of what Muon exchanges and iterates on

// The whole shape of a parameter described for --tp T: T parts along its tp_dim.
std::vector<int64_t> whole_shape(const PlanParam& p, int tp_size) {
  std::vector<int64_t> shape = p.shape;
  if (p.tp_dim >= 0 && tp_size > 1) shape.at(static_cast<size_t>(p.tp_dim)) *= tp_size;
  return shape;
}

}  // namespace

bool plans_muon(const PlanOptimizer& optimizer) { return optimizer.name == "Muon"; }

bool steps_with_muon(const PlanParam& param, bool in_root) {
  // A description's root holds the embeddings (the only modules whose kind a PlanParam does not
  // tell); the rest is split_for_muon's own rule.
  return !in_root && param.requires_grad && optim::is_hidden_matrix(param.name, param.shape, /*embedding_module=*/false);
}

double MuonOwners::busiest_flops() const {
  return flops.empty() ? 0 : *std::max_element(flops.begin(), flops.end());
}

double MuonOwners::total_flops() const { return std::accumulate(flops.begin(), flops.end(), 0.0); }

MuonOwners muon_owners(const PlanSetup& setup, int shard_group_size) {
  MuonOwners owners;
  if (!plans_muon(setup.policy.optimizer)) return owners;
  const PlanModel& model = setup.model;
  const int t = owners.tp_size = setup.policy.tp_size;
  std::vector<optim::muon::MatrixCost> costs;
  for (size_t u = 1; u <= model.units.size(); ++u) {  // the root's are AdamW's
    const PlanUnit& unit = model.units[u - 1];
    for (size_t i = 0; i < unit.params.size(); ++i) {
      const PlanParam& p = unit.params[i];
      if (!steps_with_muon(p, /*in_root=*/false)) continue;
      const std::vector<int64_t> whole = whole_shape(p, t);
      const bool split = p.tp_dim >= 0 && t > 1;
      const double flops = optim::muon::iteration_flops(whole, setup.policy.optimizer.ns_steps);
      owners.matrices.push_back({p.name, u, i, whole[0], whole[1], p.numel(), split, flops, 0, -1});
      // The run places by one iteration's flops: the same order as ns_steps of them.
      costs.push_back({optim::muon::iteration_flops(whole, 1), static_cast<int>(u), split});
    }
  }
  const optim::muon::StepOwners chosen = optim::muon::choose_step_owners(costs, shard_group_size, t);
  owners.flops.assign(static_cast<size_t>(shard_group_size) * t, 0.0);
  for (size_t k = 0; k < owners.matrices.size(); ++k) {
    MuonMatrix& m = owners.matrices[k];
    m.owner = chosen.shard[k];
    m.tp_owner = chosen.tp[k];
    for (int index = 0; index < t; ++index) {  // a replicated matrix: by each tp rank's owner
      if (!m.split || index == m.tp_owner) owners.flops[static_cast<size_t>(m.owner * t + index)] += m.flops;
    }
  }
  return owners;
}

MuonRankWork muon_rank_work(const PlanSetup& setup, const RankLayout& layout, const MuonOwners& owners, int tp_index) {
  MuonRankWork work;
  if (!plans_muon(setup.policy.optimizer) || owners.matrices.empty()) return work;
  const int position = layout.rank % layout.shard_group_size;  // shard groups: consecutive ranks
  std::vector<optim::muon::MatrixShare> shares;
  work.matrices = static_cast<int64_t>(owners.matrices.size());
  for (const MuonMatrix& m : owners.matrices) {
    const int64_t piece = layout.units[m.unit].param_pieces[m.param];
    const bool owned = m.owner == position, owned_whole = owned && m.split && m.tp_owner == tp_index;
    shares.push_back({m.name, m.rows, m.cols, m.part, piece, m.split, owned, owned_whole});
    if (!owned) {
      work.sent_to_owners += piece * kBf16;
      continue;
    }
    work.sent_by_owner += (m.part - piece) * kBf16;
    if (!m.split) continue;
    if (owned_whole) {
      work.sent_by_tp_owner += (m.rows * m.cols - m.part) * kBf16;
    } else {
      work.sent_to_tp_owners += m.part * kBf16;
    }
  }
  const optim::muon::StepPhase top = optim::muon::highest(optim::muon::step_phases(shares));
  work.workspace = top.bytes;
  work.workspace_at = top.at;
  // The momentum: this rank's pieces, in each matrix's dtype (its flat group's shard dtype).
  for (const UnitLayout& unit : layout.units) {
    for (const FlatGroupLayout& g : unit.flats) work.momentum_bytes += g.muon_piece_numel * g.shard_bytes;
  }
  return work;
}

namespace {

// An all-to-all over `members` consecutive ranks from `first` (of `world`, in its own ranks), of
// `bytes` sent by this rank; the share of each rank's peers on other hosts, averaged over the
// group (an all-to-all sends to each peer directly).
PlannedCollective all_to_all(const PlanWorld& world, int first, int members, int64_t bytes) {
  const int rph = world.ranks_per_host;
  int crossing = 0;
  for (int a = first; a < first + members; ++a) {
    for (int b = first; b < first + members; ++b) crossing += a != b && a / rph != b / rph;
  }
  const double share = static_cast<double>(crossing) / (static_cast<double>(members) * (members - 1));
  PlannedCollective c{PlannedCollective::AllToAll, 0, false, bytes, members - 1, share};
  c.once_per_step = true;
  return c;
}

}  // namespace

std::vector<PlannedCollective> muon_collectives(const PlanSetup& setup, const PlanWorld& full_world,
                                                const RankLayout& layout, const MuonRankWork& work) {
  std::vector<PlannedCollective> exchange;
  const int f = layout.shard_group_size, t = setup.policy.tp_size;
  // The shard group: F consecutive data-parallel ranks; the tp group: T consecutive world ranks
  // (data-parallel rank d at tp index i is world rank d*T + i).
  if (f > 1 && work.matrices > 0) {
    // Muon's check that every rank of the shard group steps the same matrices: an int32 each.
    exchange.push_back(shard_group_all_reduce(setup, layout, 4 * work.matrices));
  }
  if (f > 1 && work.sent_to_owners + work.sent_by_owner > 0) {
    const int first = layout.rank / f * f;
    exchange.push_back(all_to_all(setup.world, first, f, work.sent_to_owners));
    exchange.push_back(all_to_all(setup.world, first, f, work.sent_by_owner));
  }
  if (t > 1 && work.sent_to_tp_owners + work.sent_by_tp_owner > 0) {
    exchange.push_back(all_to_all(full_world, layout.rank * t, t, work.sent_to_tp_owners));
    exchange.push_back(all_to_all(full_world, layout.rank * t, t, work.sent_by_tp_owner));
  }
  return exchange;
}

double newton_schulz_seconds(const PlanSetup& setup, const MuonOwners& owners) {
  // The iteration runs in bf16 whatever the policy computes in; a device described in fp32 only
  // runs it at that rate.
  const double bf16 = setup.device.low_precision.matmul_flops;
  const double rate = bf16 > 0 ? bf16 : setup.device.fp32.matmul_flops;
  return rate > 0 ? owners.busiest_flops() / rate : 0;
}

}  // namespace fsdp::planning
