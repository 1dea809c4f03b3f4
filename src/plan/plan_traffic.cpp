#include "plan/plan_traffic.h"

#include <cmath>

namespace fsdp::planning {

namespace {

// Of the ranks of a ring over {first, first + stride, ...} (n ranks), the share whose next rank
// is on another host.
double cross_host_share(int first, int stride, int n, int ranks_per_host) {
  int crossing = 0;
  for (int i = 0; i < n; ++i) {
    const int rank = first + i * stride, next = first + ((i + 1) % n) * stride;
    crossing += rank / ranks_per_host != next / ranks_per_host;
  }
  return static_cast<double>(crossing) / n;
}

int64_t ring_all_reduce_bytes(int64_t bytes, int n) { return 2 * (n - 1) * bytes / n; }

}  // namespace

std::vector<PlannedCollective> step_collectives(const PlanSetup& setup, const RankLayout& layout) {
  const int f = layout.shard_group_size, r = layout.replicas, w = setup.world.world_size;
  const int rph = setup.world.ranks_per_host, rank = layout.rank;
  const double shard_cross = f > 1 ? cross_host_share(rank / f * f, 1, f, rph) : 0;
  const double replica_cross = r > 1 ? cross_host_share(rank % f, f, r, rph) : 0;
  const Precision& p = layout.precision;
  std::vector<PlannedCollective> out;
  auto gather = [&](size_t u, bool backward) {
    const UnitLayout& unit = layout.units[u];
    if (f > 1) out.push_back({PlannedCollective::AllGather, u, backward, (f - 1) * unit.shard_numel * p.compute_bytes, f - 1, shard_cross});
  };
  auto reduce = [&](size_t u) {
    const UnitLayout& unit = layout.units[u];
    if (!unit.trainable || w == 1) return;
    const int64_t shard = unit.shard_numel * p.reduce_bytes;
    if (f > 1) out.push_back({PlannedCollective::ReduceScatter, u, true, (f - 1) * shard, f - 1, shard_cross});
    if (r > 1) out.push_back({PlannedCollective::AllReduce, u, true, ring_all_reduce_bytes(shard, r), 2 * (r - 1), replica_cross});
  };
  for (size_t u = 0; u < layout.units.size(); ++u) gather(u, false);
  for (size_t u = layout.units.size() - 1; u >= 1; --u) {
    if (layout.units[u].reshard_after_forward) gather(u, true);
    reduce(u);
  }
  reduce(0);
  if (w > 1 && setup.model.step_all_reduce_bytes > 0) {
    out.push_back({PlannedCollective::AllReduce, 0, true,
                   ring_all_reduce_bytes(setup.model.step_all_reduce_bytes, w), 2 * (w - 1),
                   cross_host_share(0, 1, w, rph), /*once_per_step=*/true});
  }
  return out;
}

PlanTraffic total_traffic(const PlanSetup& setup, const std::vector<PlannedCollective>& collectives) {
  const int64_t micro_batches = setup.policy.micro_batches;
  const int64_t reducing = setup.policy.no_sync ? 1 : micro_batches;
  PlanTraffic t;
  for (const auto& c : collectives) {
    const int64_t times = c.once_per_step ? 1 : c.kind == PlannedCollective::AllGather ? micro_batches : reducing;
    const int64_t bytes = c.bytes * times;
    (c.kind == PlannedCollective::AllGather       ? t.all_gather
     : c.kind == PlannedCollective::ReduceScatter ? t.reduce_scatter
                                                  : t.all_reduce) += bytes;
    const auto crossing = static_cast<int64_t>(std::llround(c.bytes * c.cross_host_share)) * times;
    t.cross_host += crossing;
    t.intra_host += bytes - crossing;
    t.collectives += times;
  }
  return t;
}

}  // namespace fsdp::planning
