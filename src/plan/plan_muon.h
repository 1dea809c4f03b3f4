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
//   Both wait at the end of the step (nothing hides them). The ranks send different amounts (the
//   owners' shares are uneven): the plan gives every rank's, the busiest and the mean. Before
//   them, an all-reduce of an int32 per matrix checks that every rank steps the same matrices.
// - Tensor parallelism ([Note: Muon on a tensor-parallel matrix]): a description made for --tp T
//   gives each rank's part and the dimension split (PlanParam::tp_dim); the whole is T parts.
//   Owners are the run's (optim/muon_owners.h, choose_step_owners): a split matrix's part goes
//   to its owner in the shard group, the parts to one member of the tp group, which
//   orthogonalizes the whole; a replicated matrix is orthogonalized by each tp rank's owner. Two
//   more all-to-alls, over the tp group: a member sends its part to the whole's owner, which
//   sends each member its part of the result.
// - Workspace at the optimizer step: the run's own list of phases (optim/muon_phases.h, [Note:
//   Muon's step in phases]) for this rank's shares of the matrices; its highest point. It grows
//   with what a rank owns, about N_muon/F: the owners' share of the matrices, not one matrix.
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
  int64_t rows = 0, cols = 0;  ///< the whole matrix's (over tensor parallelism too)
  int64_t part = 0;        ///< a tp rank's part's elements (the whole when not split)
  bool split = false;      ///< split over the tp ranks
  double flops = 0;        ///< of its iteration per step
  int owner = 0;           ///< its owner's position in the shard group
  int tp_owner = -1;       ///< split: the member of the tp group that orthogonalizes the whole
};

/// Every matrix Muon steps, in the model's order, with its owners: the same for every shard group.
struct MuonOwners {
  int tp_size = 1;
  std::vector<MuonMatrix> matrices;
  std::vector<double> flops;  ///< Newton-Schulz flops per step at (position, tp index): [position * T + index]
  double busiest_flops() const;
  double total_flops() const;
};
/// None without Muon.
MuonOwners muon_owners(const PlanSetup& setup, int shard_group_size);

/// What Muon costs one rank per step.
struct MuonRankWork {
  int64_t matrices = 0;        ///< stepped (each rank of a shard group checks they are the same)
  int64_t momentum_bytes = 0;  ///< of this rank's pieces
  int64_t workspace = 0;       ///< the exchange's and the iteration's highest point
  std::string workspace_at;    ///< when: "the second all-to-all", "orthogonalizing <matrix>", ...
  int64_t sent_to_owners = 0;  ///< bytes: its bf16 pieces of the matrices others own
  int64_t sent_by_owner = 0;   ///< bytes: the bf16 pieces of its results for the others
  int64_t sent_to_tp_owners = 0;  ///< bytes: its bf16 parts of the split matrices others assemble
  int64_t sent_by_tp_owner = 0;   ///< bytes: the parts of its whole results for the other members
  int64_t sent() const { return sent_to_owners + sent_by_owner + sent_to_tp_owners + sent_by_tp_owner; }
};
/// Rank `layout.rank` of the data-parallel world at index `tp_index` of its tp group.
MuonRankWork muon_rank_work(const PlanSetup& setup, const RankLayout& layout, const MuonOwners& owners, int tp_index);

/// The all-to-alls of a step (none at F = 1 and T = 1 or without Muon), waited for at its end:
/// `setup` is the data-parallel world's ([Note: tensor parallelism in the plan]), `full_world`
/// the whole one.
std::vector<PlannedCollective> muon_collectives(const PlanSetup& setup, const PlanWorld& full_world,
                                                const RankLayout& layout, const MuonRankWork& work);
/// The busiest rank's iteration at the device's bf16 matmul rate.
double newton_schulz_seconds(const PlanSetup& setup, const MuonOwners& owners);

}  // namespace fsdp::planning
