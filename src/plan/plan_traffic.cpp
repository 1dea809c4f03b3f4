#include "plan/plan_traffic.h"

namespace fsdp::planning {

namespace {

// Whether `rank`'s next rank in a ring over {first, first + stride, ...} (n ranks) is on another host.
bool next_is_cross_host(int rank, int first, int stride, int n, int ranks_per_host) {
  const int index = (rank - first) / stride;
  const int next = first + ((index + 1) % n) * stride;
  return rank / ranks_per_host != next / ranks_per_host;
}

int64_t ring_all_reduce_bytes(int64_t bytes, int n) { return 2 * (n - 1) * bytes / n; }

}  // namespace

std::vector<PlannedCollective> step_collectives(const PlanSetup& setup, const RankLayout& layout) {
  const int f = layout.shard_group_size, r = layout.replicas, w = setup.world.world_size;
  const int rph = setup.world.ranks_per_host, rank = layout.rank;
  const bool shard_cross = f > 1 && next_is_cross_host(rank, rank / f * f, 1, f, rph);
  const bool replica_cross = r > 1 && next_is_cross_host(rank, rank % f, f, r, rph);
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
                   next_is_cross_host(rank, 0, 1, w, rph)});
  }
  return out;
}

PlanTraffic total_traffic(const std::vector<PlannedCollective>& collectives) {
  PlanTraffic t;
  for (const auto& c : collectives) {
    (c.kind == PlannedCollective::AllGather       ? t.all_gather
     : c.kind == PlannedCollective::ReduceScatter ? t.reduce_scatter
                                                  : t.all_reduce) += c.bytes;
    (c.cross_host ? t.cross_host : t.intra_host) += c.bytes;
    ++t.collectives;
  }
  return t;
}

}  // namespace fsdp::planning
