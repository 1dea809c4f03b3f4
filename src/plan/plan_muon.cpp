#include "plan/plan_muon.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <queue>
#include <string_view>
#include <utility>

namespace fsdp::planning {

namespace {

// split_for_muon's head modules: a parameter "<...>.<head>.<leaf>" or "<head>.<leaf>".
bool in_head_module(std::string_view name) {
  const size_t leaf = name.rfind('.');
  if (leaf == std::string_view::npos) return false;
  const std::string_view module_path = name.substr(0, leaf);
  const size_t dot = module_path.rfind('.');
  const std::string_view module = dot == std::string_view::npos ? module_path : module_path.substr(dot + 1);
  return module == "lm_head" || module == "head" || module == "output";
}

// Every matrix of the model, in order, with this rank's piece and the iteration's flops.
std::vector<MuonMatrix> matrices_of(const PlanSetup& setup, const RankLayout& layout) {
  std::vector<MuonMatrix> out;
  const PlanModel& model = setup.model;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const PlanUnit& unit = u == 0 ? model.root : model.units[u - 1];
    for (size_t i = 0; i < unit.params.size(); ++i) {
      const PlanParam& p = unit.params[i];
      if (!steps_with_muon(p, u == 0)) continue;
      out.push_back({p.name, u, p.shape[0], p.shape[1], layout.units[u].param_pieces[i],
                     newton_schulz_flops(p.shape[0], p.shape[1], setup.policy.optimizer.ns_steps), 0});
    }
  }
  return out;
}

// [Note: Muon's owners]'s rule: unit by unit in the order backward reduces them (the last unit
// first, the root last), each unit's matrices by decreasing flops (ties: the earlier), each to the
// position with the least work so far (ties: the lower); the loads carry over from unit to unit.
void choose_owners(std::vector<MuonMatrix>& matrices, int group_size, std::vector<double>& loads) {
  using Load = std::pair<double, int>;
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> least;
  loads.assign(static_cast<size_t>(group_size), 0.0);
  for (int position = 0; position < group_size; ++position) least.push({0.0, position});
  std::vector<size_t> order(matrices.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    // Backward's order: the last unit first, the root (index 0) last.
    if (matrices[a].unit != matrices[b].unit) return matrices[a].unit > matrices[b].unit;
    return matrices[a].flops > matrices[b].flops;
  });
  for (size_t m : order) {
    const auto [load, position] = least.top();
    least.pop();
    matrices[m].owner = position;
    loads[static_cast<size_t>(position)] = load + matrices[m].flops;
    least.push({loads[static_cast<size_t>(position)], position});
  }
}

}  // namespace

bool plans_muon(const PlanOptimizer& optimizer) { return optimizer.name == "Muon"; }

bool steps_with_muon(const PlanParam& param, bool in_root) {
  return !in_root && param.requires_grad && param.shape.size() == 2 &&
         param.name.find("embed") == std::string::npos && !in_head_module(param.name);
}

double newton_schulz_flops(int64_t rows, int64_t cols, int64_t ns_steps) {
  const double m = static_cast<double>(std::min(rows, cols)), n = static_cast<double>(std::max(rows, cols));
  const double gram = 2 * m * m * n, square = 2 * m * m * m, times_iterate = 2 * m * m * n;
  return static_cast<double>(ns_steps) * (gram + square + times_iterate);
}

int64_t owner_workspace_bytes(int64_t rows, int64_t cols) {
  const int64_t m = std::min(rows, cols);
  const int64_t whole_fp32 = 4 * rows * cols;
  const int64_t iterates_bf16 = 2 * (2 * rows * cols);  // X and the next X
  const int64_t grams_bf16 = 2 * (2 * m * m);           // A and B
  return whole_fp32 + iterates_bf16 + grams_bf16;
}

double MuonRankWork::busiest_flops() const {
  return group_flops.empty() ? 0 : *std::max_element(group_flops.begin(), group_flops.end());
}

MuonRankWork muon_rank_work(const PlanSetup& setup, const RankLayout& layout) {
  MuonRankWork work;
  if (!plans_muon(setup.policy.optimizer)) return work;
  work.matrices = matrices_of(setup, layout);
  const int f = layout.shard_group_size;
  choose_owners(work.matrices, f, work.group_flops);
  const int position = layout.rank % f;  // shard groups: consecutive ranks
  for (const MuonMatrix& m : work.matrices) {
    if (m.owner == position) {
      const int64_t bytes = owner_workspace_bytes(m.rows, m.cols);
      if (bytes > work.workspace) {
        work.workspace = bytes;
        work.workspace_of = m.name;
      }
      work.sent_by_owner += (m.rows * m.cols - m.piece) * 2;  // bf16 results
    } else {
      work.sent_to_owners += m.piece * 4;  // fp32 updates
    }
  }
  // The momentum: this rank's pieces, in each matrix's dtype (its flat group's shard dtype).
  for (const UnitLayout& unit : layout.units) {
    for (const FlatGroupLayout& g : unit.flats) work.momentum_bytes += g.muon_piece_numel * g.shard_bytes;
  }
  return work;
}

std::vector<PlannedCollective> muon_collectives(const PlanSetup& setup, const RankLayout& layout,
                                                const MuonRankWork& work) {
  const int f = layout.shard_group_size;
  if (f == 1 || work.matrices.empty()) return {};
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

double newton_schulz_seconds(const PlanSetup& setup, const MuonRankWork& work) {
  // The iteration runs in bf16 whatever the policy computes in; a device described in fp32 only
  // runs it at that rate.
  const double bf16 = setup.device.low_precision.matmul_flops;
  const double rate = bf16 > 0 ? bf16 : setup.device.fp32.matmul_flops;
  return rate > 0 ? work.busiest_flops() / rate : 0;
}

}  // namespace fsdp::planning
