#pragma once
// [Note: Muon in the plan]
// A plan with optimizer "Muon" is fsdp::optim::Muon on the hidden matrices and AdamW on the rest,
// as a program builds them from fsdp::optim::split_for_muon. What it costs, on top of a plan's
// other terms:
// - Which parameters: split_for_muon's own rule (fsdp::optim::is_hidden_matrix: 2-D, not an
//   embedding's, not an output head's) on the trainable parameters of the units other than the
//   root. The root of a GPT or Llama description holds the embeddings (wte, wpe), the final norm
//   and the head: all AdamW's. A frozen matrix is neither optimizer's.
// - State: Muon keeps one momentum_buffer element per parameter element, sharded like every
//   optimizer state (this rank's pieces, in the parameter's dtype); AdamW its two moments for the
//   rest ([Note: what an optimizer keeps, once]). The element-wise step (momentum lerp, Nesterov,
//   weight decay, the update) runs on the pieces: its bytes are those of an optimizer with one
//   state tensor.
// - Owners: each matrix is orthogonalized whole by one rank of its shard group, chosen by the
//   run's own rule (optim/muon_owners.h, [Note: Muon's owners]: longest-processing-time on the
//   iteration's flops, unit by unit in the order backward reduces them), so the plan's owners are
//   the run's. The busiest rank does at most the balanced share total/F plus one matrix. Under
//   HYBRID each shard group orthogonalizes its own copy; at F = 1 (NO_SHARD, one rank) the rank
//   owns every matrix and nothing moves.
// - Exchange (optim/muon_exchange.h): two all-to-alls over the shard group per step, both in
//   bf16. A rank sends its piece of every matrix another rank owns; an owner sends each other
//   rank that rank's piece of the result. A rank owns 1/F of the matrices and not (F-1)/F of them,
//   so it sends about (F-1)/F x N_muon/F elements each way (N_muon: the matrices' elements), 4
//   bytes in all, against the fp32 gradient reduce-scatter's (F-1)/F x Ψ x 4: at most 1/F of it.
//   Both wait at the end of the step (nothing hides them).
// - Workspace at the optimizer step (Muon::step exchanges every matrix at once; e = 2 bytes of
//   bf16, P: this rank's piece elements of all matrices, O: the elements of the matrices it owns,
//   O_tall: of those taller than wide). Alive in turn beside its bf16 pieces (eP):
//     the first all-to-all: its send buffer and the owned matrices' pieces received, eP + eO;
//     assembling: the received pieces and the whole matrices, 2eO;
//     the iteration on owned matrix k (m x n, m <= n): the wholes, the results before it, and the
//     iterate and the next one with the gram A and B = bA + cA·A: eO + e Σ_{j<k} mn + 2e mn + 2e m²;
//     the second all-to-all: the wholes, the results, their contiguous copies of the tall ones
//     (a transposed result), its send buffer and its pieces received: 3eO + e O_tall + eP.
//   The highest is the rank's; a rank that owns nothing still holds 2eP. It grows with what a
//   rank owns, about N_muon/F: the owners' share of the matrices, not one matrix.
// - Time: ns_steps iterations of 2m²n (the gram) + 2m³ (A·A) + 2m²n (B·X) flops
//   (optim/newton_schulz.h's iteration_flops), the busiest rank's share at the device's bf16
//   matmul rate (KernelRates::matmul_flops of low_precision; the iteration runs in bf16 whatever
//   the policy), added to the optimizer's time.
// Left out: StepInBackward's exchange unit by unit (smaller, and overlapped with backward): the
// plan is of Muon stepped by step().

#include "plan/plan_layout.h"
#include "plan/plan_traffic.h"

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::planning {

/// Whether `optimizer` is the Muon plan (Muon for the matrices, AdamW for the rest).
bool plans_muon(const PlanOptimizer& optimizer);
/// Whether a Muon plan steps `param` with Muon (a trainable hidden matrix) rather than AdamW;
/// `in_root`: it is a parameter of the root unit.
bool steps_with_muon(const PlanParam& param, bool in_root);

/// One matrix Muon steps.
struct MuonMatrix {
  std::string name;
  size_t unit = 0;         ///< index in RankLayout::units (0: the root)
  size_t param = 0;        ///< index in its unit's params
  int64_t rows = 0, cols = 0;
  double flops = 0;        ///< of its iteration per step
  int owner = 0;           ///< its owner's position in the shard group
};

/// Every matrix Muon steps, in the model's order, with its owner: the same for every shard group.
struct MuonOwners {
  std::vector<MuonMatrix> matrices;
  std::vector<double> group_flops;  ///< each position's Newton-Schulz flops per step
  double busiest_flops() const;
};
/// None without Muon.
MuonOwners muon_owners(const PlanSetup& setup, int shard_group_size);

/// What Muon costs one rank per step.
struct MuonRankWork {
  int64_t momentum_bytes = 0;  ///< of this rank's pieces
  int64_t workspace = 0;       ///< the exchange's and the iteration's highest point
  std::string workspace_at;    ///< when: "the second all-to-all", "orthogonalizing <matrix>", ...
  int64_t sent_to_owners = 0;  ///< bytes: its bf16 pieces of the matrices others own
  int64_t sent_by_owner = 0;   ///< bytes: the bf16 pieces of its results for the others
};
MuonRankWork muon_rank_work(const PlanSetup& setup, const RankLayout& layout, const MuonOwners& owners);

/// The two all-to-alls of a step (none at F = 1 or without Muon), waited for at its end.
std::vector<PlannedCollective> muon_collectives(const PlanSetup& setup, const RankLayout& layout,
                                                const MuonRankWork& work);
/// The busiest rank's iteration at the device's bf16 matmul rate.
double newton_schulz_seconds(const PlanSetup& setup, const MuonOwners& owners);

}  // namespace fsdp::planning
