#pragma once
// [Note: Muon's owners]
// Muon orthogonalizes each matrix whole, so each matrix has one owner in its shard group: the
// rank that receives the others' pieces of its update, runs the Newton-Schulz iteration and sends
// each rank its piece of the result. The iteration's cost grows as m^2 n (m, n: the smaller and
// larger dimension), so owners are chosen by longest-processing-time: matrices by decreasing
// flops, each to the rank with the least work so far (ties: the earlier matrix, the lower rank).
// The busiest rank then does at most the balanced share plus one matrix. It runs over the
// matrices unit by unit, in the order backward reduces them (the last unit first), carrying the
// ranks' loads from unit to unit: with StepInBackward each unit's matrices are exchanged as soon
// as the unit's gradients are reduced, and spreading each unit's matrices over the ranks keeps
// every rank busy while backward goes on. Every rank computes the same owners from the same
// shapes: nothing is exchanged to agree on them.
// Under tensor parallelism ([Note: Muon on a tensor-parallel matrix]) a split matrix has a second
// owner: the member of its tp group that puts the whole together. Those are chosen the same way
// among the T members, over the split matrices that one position of the shard group owns (the
// same position on every tp rank), so the matrices spread over every rank holding their pieces.

#include <cstdint>
#include <vector>

namespace fsdp::optim::muon {

/// One matrix to place: its iteration's flops and the unit it belongs to (units numbered in
/// forward order).
struct MatrixCost {
  double flops = 0;
  int unit = 0;
  bool split = false;  ///< split over more than one tensor-parallel rank
};

/// The owner (a position in a shard group of `group_size`) of each of `matrices`, in order.
std::vector<int> choose_owners(const std::vector<MatrixCost>& matrices, int group_size);

/// The owners of a step's matrices, in their order: `shard[i]`, the position in the shard group
/// that assembles matrix i (this tp rank's part of it, whole over FSDP); `tp[i]`, for a split
/// matrix, the member of its tp group that assembles the whole (-1 for the others).
struct StepOwners {
  std::vector<int> shard, tp;
};
StepOwners choose_step_owners(const std::vector<MatrixCost>& matrices, int shard_group_size, int tp_size);

}  // namespace fsdp::optim::muon
