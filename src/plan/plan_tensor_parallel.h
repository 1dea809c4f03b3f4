#pragma once
// [Note: tensor parallelism in the plan]
// A model described for a tensor-parallel size T (PlanModel::tp_size) is ONE TP rank's share:
// its parameters' local shapes (matrices and embeddings split T ways, norms whole), the
// activations it keeps (sequence-parallel: the residual stream /T, attention and MLP internals
// /T, their gathered inputs whole), its work /T, and the TP collectives each unit issues
// (PlanUnit::tp_collectives, from the describer's formulas: gpt_plan.cpp). The mesh is
// dp_replicate x dp_shard x tp, outermost first: world rank = dp*T + t, TP groups consecutive
// ranks (inside a host), FSDP over the W/T data-parallel ranks of one TP index. So the plan's
// FSDP part is the plan of the data-parallel world (data_parallel_setup: W/T ranks, R/T on a
// host) over the TP-local model, unchanged; TP adds its bytes (apart: tp_all_gather, ...) and
// their time. A TP collective blocks the compute that needs its result (the next matmul, the
// norm after it): its whole time is exposed, at the intra-host link's bandwidth, or the
// network's when a group is wider than a host (T > ranks per host: marked in the plan).

#include <fsdp/plan.h>

namespace fsdp::planning {

/// Throws naming --tp when the world, its hosts or the model's description cannot take it.
void validate_tensor_parallel(const PlanSetup& setup);

/// A TP group is wider than a host.
bool tp_spans_hosts(const PlanWorld& world, int tp_size);

/// The data-parallel world FSDP runs over: W/T ranks, ranks_per_host/T of them on a host (1 when
/// a TP group spans hosts). `setup` itself at T = 1.
PlanSetup data_parallel_setup(const PlanSetup& setup);

/// TP's part of a step: its bytes (the tp_* fields and the links'), calls and seconds.
struct TensorParallelStep {
  PlanTraffic traffic;
  double seconds = 0;
};
TensorParallelStep tensor_parallel_step(const PlanSetup& setup);

}  // namespace fsdp::planning
