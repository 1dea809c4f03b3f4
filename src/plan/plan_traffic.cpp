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

// The rings of this rank: its shard group's (F consecutive ranks) and its replicas' (stride F).
struct Rings {
  int f, r;
  double shard_cross, replica_cross;
};

Rings rings_of(const PlanSetup& setup, const RankLayout& layout) {
  const int f = layout.shard_group_size, r = layout.replicas, rph = setup.world.ranks_per_host;
  return {f, r, f > 1 ? cross_host_share(layout.rank / f * f, 1, f, rph) : 0,
          r > 1 ? cross_host_share(layout.rank % f, f, r, rph) : 0};
}

std::vector<PlannedCollective> gather_collectives(const PlanSetup& setup, const RankLayout& layout, size_t unit,
                                                  const FlatGroupLayout& g, bool backward) {
  const Rings rings = rings_of(setup, layout);
  if (rings.f == 1) return {};
  return {{PlannedCollective::AllGather, unit, backward, (rings.f - 1) * g.shard_numel * g.gather_bytes,
           rings.f - 1, rings.shard_cross}};
}

std::vector<PlannedCollective> reduce_collectives(const PlanSetup& setup, const RankLayout& layout, size_t unit,
                                                  const FlatGroupLayout& g) {
  const Rings rings = rings_of(setup, layout);
  const int64_t shard = g.shard_numel * g.reduce_bytes;
  std::vector<PlannedCollective> out;
  if (rings.f > 1) out.push_back({PlannedCollective::ReduceScatter, unit, true, (rings.f - 1) * shard, rings.f - 1, rings.shard_cross});
  if (rings.r > 1) {
    out.push_back({PlannedCollective::AllReduce, unit, true, ring_all_reduce_bytes(shard, rings.r), 2 * (rings.r - 1),
                   rings.replica_cross});
  }
  return out;
}

PlannedCollective shard_group_all_reduce(const PlanSetup& setup, const RankLayout& layout, int64_t bytes) {
  const Rings rings = rings_of(setup, layout);
  PlannedCollective c{PlannedCollective::AllReduce, 0, false, ring_all_reduce_bytes(bytes, rings.f), 2 * (rings.f - 1),
                      rings.shard_cross};
  c.once_per_step = true;
  return c;
}

std::vector<PlannedCollective> program_collectives(const PlanSetup& setup) {
  const int w = setup.world.world_size;
  if (w == 1 || setup.model.step_all_reduce_bytes == 0) return {};
  return {{PlannedCollective::AllReduce, 0, true, ring_all_reduce_bytes(setup.model.step_all_reduce_bytes, w),
           2 * (w - 1), cross_host_share(0, 1, w, setup.world.ranks_per_host), /*once_per_step=*/true}};
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
     : c.kind == PlannedCollective::AllToAll      ? t.all_to_all
                                                  : t.all_reduce) += bytes;
    const auto crossing = static_cast<int64_t>(std::llround(c.bytes * c.cross_host_share)) * times;
    t.cross_host += crossing;
    t.intra_host += bytes - crossing;
    t.collectives += times;
  }
  return t;
}

}  // namespace fsdp::planning
