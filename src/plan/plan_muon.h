#pragma once
// [Note: Muon in the plan]
// A plan with optimizer "Muon" is fsdp::optim::Muon on the hidden matrices and AdamW on the rest,
// as a program builds them from fsdp::optim::split_for_muon. What it costs, on top of a plan's
// other terms:
// - Which parameters: the trainable 2-D parameters of the units other than the root, but those
//   named like an embedding ("embed") or held by a head module ("lm_head", "head", "output":
//   split_for_muon's names). The root of a GPT or Llama description holds the embeddings (wte,
//   wpe), the final norm and the head: all AdamW's. A frozen matrix is neither optimizer's.
// - State: Muon keeps one momentum_buffer element per parameter element, sharded like every
//   optimizer state (this rank's pieces, in the parameter's dtype); AdamW its two moments for the
//   rest ([Note: what an optimizer keeps, once]). The element-wise step (momentum lerp, Nesterov,
//   weight decay, the update) runs on the pieces: its bytes are those of an optimizer with one
//   state tensor.
// - Owners: each matrix is orthogonalized whole by one rank of its shard group, chosen by
//   longest-processing-time on the iteration's flops, unit by unit in the order backward reduces
//   them, the ranks' loads carried from unit to unit ([Note: Muon's owners], optim/muon_owners.h:
//   the same rule, so the plan's owners are the run's). The busiest rank does at most the balanced
//   share total/F plus one matrix. Under HYBRID each shard group orthogonalizes its own copy; at
//   F = 1 (NO_SHARD, one rank) the rank owns every matrix and nothing moves.
// - Exchange: two all-to-alls over the shard group per step. A rank sends its fp32 piece of every
//   matrix another rank owns (4 bytes an element); an owner sends each other rank that rank's
//   piece of the result, in bf16 (2 bytes). A rank is not the owner of (F-1)/F of the matrices
//   and owns 1/F of them, so it sends about (F-1)/F x N_muon/F elements each way (N_muon: the
//   matrices' elements), 6 bytes in all, against the fp32 gradient reduce-scatter's
//   (F-1)/F x Ψ x 4: at most 1.5/F of it (3/4 at F = 2, under a fifth at F = 8). Both wait at the
//   end of the step (nothing hides them).
// - Owner's workspace: while it orthogonalizes a rows x cols matrix (m = min, n = max) an owner
//   holds the whole fp32 update (4mn bytes) and the iteration's live bf16 tensors: the iterate X
//   and the next one (2 x 2mn; its transpose is a view), the gram A = X Xᵀ and B = bA + cA·A
//   (2 x 2m²): 8mn + 4m² bytes. One matrix at a time, so a rank's extra peak at the optimizer
//   step is that of the largest matrix it owns, at most the model's largest matrix's.
// - Time: ns_steps iterations of 2m²n (the gram) + 2m³ (A·A) + 2m²n (B·X) flops, the busiest
//   rank's share at the device's bf16 matmul rate (KernelRates::matmul_flops of low_precision; the
//   iteration runs in bf16 whatever the policy), added to the optimizer's time.
// Left out: the send and receive buffers of the exchange (a rank's fp32 pieces of the matrices,
// N_muon/F x 4 bytes at most, alive with the gradient shards), and the overlap StepInBackward
// gives an owner (the iteration during backward): the plan is of Muon stepped by step().

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

/// The Newton-Schulz iteration's flops on one rows x cols matrix for `ns_steps` iterations.
double newton_schulz_flops(int64_t rows, int64_t cols, int64_t ns_steps);
/// An owner's transient bytes while it orthogonalizes one rows x cols matrix.
int64_t owner_workspace_bytes(int64_t rows, int64_t cols);

/// One matrix Muon steps, as one rank of its shard group sees it.
struct MuonMatrix {
  std::string name;
  size_t unit = 0;         ///< index in RankLayout::units
  int64_t rows = 0, cols = 0;
  int64_t piece = 0;       ///< this rank's elements of it
  double flops = 0;        ///< of its iteration per step
  int owner = 0;           ///< its owner's position in the shard group
};

/// What Muon costs one rank per step (a Muon plan; zeros otherwise).
struct MuonRankWork {
  std::vector<MuonMatrix> matrices;  ///< every matrix, in the model's order
  int64_t momentum_bytes = 0;        ///< of this rank's pieces
  int64_t workspace = 0;             ///< of the largest matrix it owns (0: it owns none)
  std::string workspace_of;          ///< that matrix
  std::vector<double> group_flops;   ///< each position of the shard group's Newton-Schulz flops
  int64_t sent_to_owners = 0;        ///< bytes: its fp32 pieces of the matrices others own
  int64_t sent_by_owner = 0;         ///< bytes: the bf16 pieces of its matrices for the others
  double busiest_flops() const;
};
MuonRankWork muon_rank_work(const PlanSetup& setup, const RankLayout& layout);

/// The two all-to-alls of a step (none at F = 1 or without Muon), waited for at its end.
std::vector<PlannedCollective> muon_collectives(const PlanSetup& setup, const RankLayout& layout,
                                                const MuonRankWork& work);
/// The busiest rank's iteration at the device's bf16 matmul rate.
double newton_schulz_seconds(const PlanSetup& setup, const MuonRankWork& work);

}  // namespace fsdp::planning
