#pragma once
// How a planned model lies on one rank: each unit's flat buffer padded to the shard group, this
// rank's shard and the pieces of the parameters in it (core/flat_layout.h's cut), and the sizes
// of the buffers a step allocates (core/unit_rules.h's rules: [Note: one rulebook, two readers]).

#include <fsdp/plan.h>

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::planning {

/// The dtypes a policy computes, reduces and keeps shards in, and their element sizes.
struct Precision {
  c10::ScalarType shard_dtype = c10::kFloat;    ///< of shards, gradient shards, optimizer state
  c10::ScalarType compute_dtype = c10::kFloat;  ///< of the unsharded parameters (what the all-gather moves)
  c10::ScalarType reduce_dtype = c10::kFloat;   ///< of the unsharded gradient (what the reductions move)
  int64_t shard_bytes = 4;
  int64_t compute_bytes = 4;
  int64_t reduce_bytes = 4;
  bool mixed() const { return compute_dtype != shard_dtype; }
};
Precision precision_of(const PlanModel& model, const FullyShardOptions& options);

/// One flat parameter of a unit on one rank: the unit has one per kind of parameter it holds
/// (rules::group_by_kind: [Note: a unit's flat parameters]).
struct FlatGroupLayout {
  bool trainable = true;
  int64_t numel = 0;         ///< of its parameters
  int64_t shard_numel = 0;   ///< ceil(numel / F)
  int64_t piece_numel = 0;   ///< of this rank's shard, held by parameters (padding excluded)
  int64_t muon_piece_numel = 0;  ///< of those, held by the matrices a Muon plan steps with Muon
  int64_t shard_bytes = 0;   ///< per element of its shard, gradient shard, optimizer state (its dtype)
  int64_t gather_bytes = 0;  ///< per element its all-gather moves (compute dtype, or its own)
  int64_t reduce_bytes = 0;  ///< per element its reductions move
  /// Forward needs a separate unsharded buffer (rules::needs_unshard): its gather takes a
  /// rate-limiter slot.
  bool needs_unshard = false;
  // Bytes of the buffers the step allocates for it.
  int64_t unsharded_params = 0;  ///< 0 when forward uses the shard itself (F = 1, no cast)
  int64_t unsharded_grad = 0;    ///< 0 when gradients go straight into the shard (W = 1), or frozen
  int64_t reduce_output = 0;     ///< a reduction's output before it lands in the gradient shard
  /// The gradient shard on the device: allocated by backward (by the first gradient when they go
  /// straight into it, else when the reduction is issued), freed by zero_grad; 0 when offloaded.
  int64_t grad_shard = 0;
  bool grads_into_shard = false;  ///< W = 1: no reduction, backward writes the gradient shard
  /// The unsharded gradient and the reduction's output when gradients cannot go straight into
  /// the shard (accumulation adds to a shard that holds a sum, no_sync keeps the sum unsharded).
  int64_t accumulating_grad = 0;
  int64_t accumulating_reduce_output = 0;
};

/// One unit on one rank: its flat groups, and their sums.
struct UnitLayout {
  std::string name;
  std::vector<FlatGroupLayout> flats;  ///< the first is the unit's main one
  int64_t numel = 0;         ///< Ψ_u
  int64_t shard_numel = 0;   ///< Σ ceil(Ψ_g / F) over its flat groups
  int64_t piece_numel = 0;   ///< of this rank's shards, held by parameters (padding excluded)
  int64_t trainable_piece_numel = 0;  ///< of those, the trainable ones' (the optimizer's state)
  int64_t muon_piece_numel = 0;  ///< of those, Muon's matrices' (a Muon plan; the rest: AdamW's)
  std::vector<int64_t> param_pieces;  ///< this rank's elements of each parameter, in PlanUnit::params' order
  int64_t param_tensors = 0;
  bool trainable = false;    ///< it has a trainable parameter
  bool reshard_after_forward = true;
  bool needs_unshard = false;    ///< a flat group needs an unsharded buffer (as FlatParam::needs_unshard)
  int64_t unsharded_params = 0;  ///< Σ FlatGroupLayout::unsharded_params
  int64_t grad_shard = 0;        ///< Σ FlatGroupLayout::grad_shard
  int64_t accumulating_grad = 0;  ///< Σ FlatGroupLayout::accumulating_grad
};

/// Every unit of `model` on `rank`: the root first, then model.units in order.
struct RankLayout {
  int rank = 0;
  int shard_group_size = 1;
  int replicas = 1;
  Precision precision;
  std::vector<UnitLayout> units;
  /// What the optimizer step holds beyond the model states (Muon's exchange and iteration:
  /// plan_muon.h), and when; set by the plan, 0 for an element-wise optimizer.
  int64_t optimizer_workspace = 0;
  std::string optimizer_workspace_at;
};

/// Throws naming the bad value (a shard group that does not divide the world, a batch < 1, ...).
void validate_setup(const PlanSetup& setup);
RankLayout layout_for_rank(const PlanSetup& setup, int rank);

}  // namespace fsdp::planning
