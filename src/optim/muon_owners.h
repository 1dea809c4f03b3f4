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

#include <cstdint>
#include <vector>

namespace fsdp::optim::muon {

/// One matrix to place: its iteration's flops and the unit it belongs to (units numbered in
/// forward order).
struct MatrixCost {
  double flops = 0;
  int unit = 0;
};

/// The owner (a position in a shard group of `group_size`) of each of `matrices`, in order.
std::vector<int> choose_owners(const std::vector<MatrixCost>& matrices, int group_size);

}  // namespace fsdp::optim::muon
