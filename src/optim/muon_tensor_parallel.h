#pragma once
// [Note: Muon on a tensor-parallel matrix]
// Under tensor parallelism a matrix is split over the tp ranks (rows or columns, or each fused
// part's rows) before FSDP shards each rank's part. Muon orthogonalizes the whole matrix, so its
// update is assembled in two stages. First, within each shard group, the FSDP pieces of each
// rank's part go to the part's owner there ([Note: Muon's owners]); owners are chosen from the
// whole matrices' shapes, which every tp rank sees alike, so the tp ranks' owners of one matrix
// are the members of one tp group. Second, within that tp group, the parts go to one member,
// which puts the whole together, runs the iteration and sends each member its part of the
// result; these owners are chosen by flops among the tp group's members, so the matrices spread
// over every rank that holds pieces of them. A replicated matrix (each tp rank holds all of it,
// with the same gradient) skips the second stage: each tp rank's owner orthogonalizes it alike.
//
// Bytes per step (bf16, 2 bytes an element): the first stage moves each rank's pieces of the
// parts as without tensor parallelism; the second, for each split matrix of n elements whole,
// sends (tp - 1) n / tp elements to its owner and as many back, summed over the tp group.

#include "comm/collectives.h"

#include <fsdp/tp_placement.h>

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace fsdp::optim::muon {

/// Each of `parts` (this rank's tensor-parallel part of a split matrix, whole over FSDP, bf16)
/// orthogonalized as the whole matrix: returns this rank's part of each result, in the part's
/// shape. Every member of `group` (collectives over the placements' tp group, or a group beside
/// it with the same members) calls it with the same matrices in the same order, and the same
/// `owners` (the member assembling each: StepOwners::tp). `orthogonalize(whole, i)` runs on the
/// owner of matrix i.
std::vector<at::Tensor> orthogonalize_split(
    Collectives& group, const std::vector<at::Tensor>& parts, const std::vector<tp::Placement>& placements,
    const std::vector<int>& owners, const std::function<at::Tensor(const at::Tensor& whole, size_t i)>& orthogonalize);

}  // namespace fsdp::optim::muon
