#pragma once
// The bytes one rank sends per step, per kind of collective exactly as fsdp::comm_stats() counts
// them (ring algorithms: an all-gather or reduce-scatter over F ranks sends F-1 shards, an
// all-reduce of b bytes over R ranks 2(R-1)b/R), and per class of link: a ring sends everything
// to the next rank of its group, on this host or on another; averaged over the group's ranks.

#include "plan/plan_layout.h"

#include <vector>

namespace fsdp::planning {

/// One collective of the step, in issue order.
struct PlannedCollective {
  enum Kind { AllGather, ReduceScatter, AllReduce, AllToAll } kind;
  size_t unit = 0;          ///< index in RankLayout::units (0: the root); the program's own: 0
  bool backward = false;    ///< issued during backward
  int64_t bytes = 0;        ///< sent by this rank
  int steps = 0;            ///< ring steps (latency)
  double cross_host_share = 0;  ///< of the group's ranks, those whose next rank is on another host
  bool spans_hosts() const { return cross_host_share > 0; }  ///< its ring runs at the network's speed
  bool once_per_step = false;  ///< the program's own (the loss): not once per micro-batch
};

/// The all-gather of flat group `g` of unit `unit` (index in RankLayout::units): none at F = 1.
std::vector<PlannedCollective> gather_collectives(const PlanSetup& setup, const RankLayout& layout, size_t unit,
                                                  const FlatGroupLayout& g, bool backward);
/// The reductions of a trainable flat group: reduce-scatter in the shard group, all-reduce across
/// the replicas.
std::vector<PlannedCollective> reduce_collectives(const PlanSetup& setup, const RankLayout& layout, size_t unit,
                                                  const FlatGroupLayout& g);
/// An all-reduce of `bytes` over this rank's shard group, once per step (F > 1).
PlannedCollective shard_group_all_reduce(const PlanSetup& setup, const RankLayout& layout, int64_t bytes);
/// The program's own collectives, once per step (gpt_train's loss).
std::vector<PlannedCollective> program_collectives(const PlanSetup& setup);
/// A whole step's bytes: every micro-batch gathers; under no_sync only the last one reduces.
PlanTraffic total_traffic(const PlanSetup& setup, const std::vector<PlannedCollective>& collectives);

}  // namespace fsdp::planning
