#include "plan/plan_muon.h"

#include <fsdp/muon.h>

#include "optim/muon_owners.h"
#include "optim/newton_schulz.h"

#include <algorithm>

namespace fsdp::planning {

namespace {

constexpr int64_t kBf16 = 2;  // bytes of what Muon exchanges and iterates on

// The highest point of Muon::step's exchange and iteration on one rank ([Note: Muon in the
// plan]): `pieces`, its elements of every matrix; `owned`, the matrices it owns in order.
void exchange_workspace(int64_t pieces, const std::vector<const MuonMatrix*>& owned, MuonRankWork& work) {
  const int64_t e = kBf16;
  int64_t whole = 0, tall = 0;
  for (const MuonMatrix* m : owned) {
    whole += m->rows * m->cols;
    if (m->rows > m->cols) tall += m->rows * m->cols;
  }
  auto consider = [&](int64_t bytes, std::string at) {
    if (bytes > work.workspace) {
      work.workspace = bytes;
      work.workspace_at = std::move(at);
    }
  };
  // Beside its pieces (e·pieces) throughout:
  consider(e * pieces + e * (pieces + whole), "the first all-to-all");
  consider(e * pieces + e * 2 * whole, "assembling the matrices it owns");
  int64_t results = 0;
  for (const MuonMatrix* m : owned) {
    const int64_t mn = m->rows * m->cols, small = std::min(m->rows, m->cols);
    consider(e * pieces + e * (whole + results + 2 * mn + 2 * small * small), "orthogonalizing " + m->name);
    results += mn;
  }
  consider(e * pieces + e * (3 * whole + tall + pieces), "the second all-to-all");
}

}  // namespace

bool plans_muon(const PlanOptimizer& optimizer) { return optimizer.name == "Muon"; }

bool steps_with_muon(const PlanParam& param, bool in_root) {
  // A description's root holds the embeddings (the only modules whose kind a PlanParam does not
  // tell); the rest is split_for_muon's own rule.
  return !in_root && param.requires_grad && optim::is_hidden_matrix(param.name, param.shape, /*embedding_module=*/false);
}

double MuonOwners::busiest_flops() const {
  return group_flops.empty() ? 0 : *std::max_element(group_flops.begin(), group_flops.end());
}

MuonOwners muon_owners(const PlanSetup& setup, int shard_group_size) {
  MuonOwners owners;
  if (!plans_muon(setup.policy.optimizer)) return owners;
  const PlanModel& model = setup.model;
  std::vector<optim::muon::MatrixCost> costs;
  for (size_t u = 1; u <= model.units.size(); ++u) {  // the root's are AdamW's
    const PlanUnit& unit = model.units[u - 1];
    for (size_t i = 0; i < unit.params.size(); ++i) {
      const PlanParam& p = unit.params[i];
      if (!steps_with_muon(p, /*in_root=*/false)) continue;
      const double flops = optim::muon::iteration_flops(p.shape, setup.policy.optimizer.ns_steps);
      owners.matrices.push_back({p.name, u, i, p.shape[0], p.shape[1], flops, 0});
      // The run places by one iteration's flops: the same order as ns_steps of them.
      costs.push_back({optim::muon::iteration_flops(p.shape, 1), static_cast<int>(u)});
    }
  }
  const std::vector<int> chosen = optim::muon::choose_owners(costs, shard_group_size);
  owners.group_flops.assign(static_cast<size_t>(shard_group_size), 0.0);
  for (size_t k = 0; k < owners.matrices.size(); ++k) {
    owners.matrices[k].owner = chosen[k];
    owners.group_flops[static_cast<size_t>(chosen[k])] += owners.matrices[k].flops;
  }
  return owners;
}

MuonRankWork muon_rank_work(const PlanSetup& setup, const RankLayout& layout, const MuonOwners& owners) {
  MuonRankWork work;
  if (!plans_muon(setup.policy.optimizer) || owners.matrices.empty()) return work;
  const int position = layout.rank % layout.shard_group_size;  // shard groups: consecutive ranks
  int64_t pieces = 0;
  std::vector<const MuonMatrix*> owned;
  for (const MuonMatrix& m : owners.matrices) {
    const int64_t piece = layout.units[m.unit].param_pieces[m.param];
    pieces += piece;
    if (m.owner == position) {
      owned.push_back(&m);
      work.sent_by_owner += (m.rows * m.cols - piece) * kBf16;
    } else {
      work.sent_to_owners += piece * kBf16;
    }
  }
  exchange_workspace(pieces, owned, work);
  // The momentum: this rank's pieces, in each matrix's dtype (its flat group's shard dtype).
  for (const UnitLayout& unit : layout.units) {
    for (const FlatGroupLayout& g : unit.flats) work.momentum_bytes += g.muon_piece_numel * g.shard_bytes;
  }
  return work;
}

std::vector<PlannedCollective> muon_collectives(const PlanSetup& setup, const RankLayout& layout,
                                                const MuonRankWork& work) {
  const int f = layout.shard_group_size;
  if (f == 1 || work.sent_to_owners + work.sent_by_owner == 0) return {};
  // The shard group is F consecutive ranks; of each rank's F-1 peers, the share on other hosts,
  // averaged over the group (an all-to-all sends to each peer directly).
  const int first = layout.rank / f * f, rph = setup.world.ranks_per_host;
  int crossing = 0;
  for (int a = first; a < first + f; ++a) {
    for (int b = first; b < first + f; ++b) crossing += a != b && a / rph != b / rph;
  }
  const double share = static_cast<double>(crossing) / (static_cast<double>(f) * (f - 1));
  PlannedCollective to_owners{PlannedCollective::AllToAll, 0, false, work.sent_to_owners, f - 1, share};
  to_owners.once_per_step = true;
  PlannedCollective from_owners = to_owners;
  from_owners.bytes = work.sent_by_owner;
  return {to_owners, from_owners};
}

double newton_schulz_seconds(const PlanSetup& setup, const MuonOwners& owners) {
  // The iteration runs in bf16 whatever the policy computes in; a device described in fp32 only
  // runs it at that rate.
  const double bf16 = setup.device.low_precision.matmul_flops;
  const double rate = bf16 > 0 ? bf16 : setup.device.fp32.matmul_flops;
  return rate > 0 ? owners.busiest_flops() / rate : 0;
}

}  // namespace fsdp::planning
