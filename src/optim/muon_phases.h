#pragma once
// [Note: Muon's step in phases]
// What one rank's Muon step holds, phase by phase, without tensors: the optimizer records it for
// each step it takes (MuonWork::workspace) and the planner sums the same list for a rank it plans
// ([Note: Muon in the plan]): one description of the step's buffers, read by both. Everything
// moved and iterated is bf16 (2 bytes an element). P: this rank's pieces of the matrices stepped
// (alive throughout); O: the parts it owns in its shard group, whole over FSDP; R: the results of
// the replicated ones among them; S: the split ones' parts; W: the whole matrices it assembles in
// its tp group ([Note: Muon on a tensor-parallel matrix]). In the order the step runs:
//   the first all-to-all: its send buffer and the parts received, P + P + O;
//   assembling them: the received buffer and the parts, P + 2O;
//   orthogonalizing replicated matrix k (m x n, m <= n) beside the parts and the results before
//   it: P + O + R_<k + 2mn + 2m² (the iterate and the next one, the gram A and B = bA + cA·A);
//   under tensor parallelism, the parts of the split matrices to their tp owners: P + O + R + S
//   (send) + W (received); the wholes' flat parts, P + O + R + 2W; orthogonalizing whole j
//   beside those and the results before it: + mn (the whole, put together) + 2mn + 2m², then
//   laying its result out by member (result, the parts, their concatenation): + 4mn; sending the
//   parts back: P + O + R + 3W + S (the flat parts, the results, the send buffer, the parts
//   received);
//   the second all-to-all: the parts, the results (O), the contiguous copies of the replicated
//   tall results (a transposed view: T_r), its send buffer (O) and its pieces received (P):
//   2P + 3O + T_r.
// A rank that owns nothing holds 2P at the second all-to-all.

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::optim::muon {

/// One matrix of a rank's step, in elements.
struct MatrixShare {
  std::string name;
  int64_t rows = 0, cols = 0;  ///< the whole matrix's (over FSDP and tensor parallelism)
  int64_t part = 0;            ///< this tp rank's part (the whole when not split)
  int64_t piece = 0;           ///< this rank's FSDP piece of its part
  bool split = false;          ///< split over more than one tp rank
  bool owned = false;          ///< this rank assembles its part (its owner in the shard group)
  bool owned_whole = false;    ///< split and owned: this rank assembles the whole (its tp owner)
};

/// One phase and the bytes alive in it.
struct StepPhase {
  std::string at;
  int64_t bytes = 0;
};

/// The phases of one rank's step over `matrices` (in the order the step exchanges them).
std::vector<StepPhase> step_phases(const std::vector<MatrixShare>& matrices);

/// The highest of `phases` (none: 0 bytes, at "").
StepPhase highest(const std::vector<StepPhase>& phases);

}  // namespace fsdp::optim::muon
