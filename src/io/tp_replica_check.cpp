#include "io/tp_replica_check.h"

#include <fsdp/distributed.h>
#include <fsdp/tensor_parallel.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <iostream>
#include <sstream>

namespace fsdp::detail {

// [Note: replicas that drifted apart]
// A parameter tensor parallelism replicates is held whole by every rank of a tp group and must
// stay equal there: its gradients are equal (or summed over the group, under sequence
// parallelism) and so are its steps. Dropout seeded per rank (`seed + rank`) in a replicated
// region breaks this without a word: each tp rank's activations, gradients and values drift
// apart, and a save keeps tp rank 0's. Each save compares, over the tp group, two sums of each
// replicated parameter's FSDP piece (the tp ranks of one dp position hold the same piece of
// structurally equal buffers): rank 0's are broadcast, each rank flags what differs, and the
// flags are summed over the tp group, then over the shard group (a piece may lie on one FSDP
// position only), so that every rank knows. Cheap: two numbers per parameter, at a save.

namespace {

struct Replicated {
  std::vector<std::string> names;
  std::vector<at::Tensor> pieces;
  std::shared_ptr<tp::TensorParallel> tp;
};

Replicated replicated_params(const ShardedView& model) {
  Replicated found;
  for (const auto& p : model.params()) {
    const auto& placement = p.tensor_parallel();
    if (!placement || !placement->replicated() || placement->tp->size() == 1) continue;
    found.tp = placement->tp;
    found.names.push_back(p.name());
    found.pieces.push_back(p.data());
  }
  return found;
}

// [sum, sum of squares] of each piece, in double, where the collectives run.
at::Tensor checksums(const std::vector<at::Tensor>& pieces, c10::Device device) {
  std::vector<at::Tensor> rows;
  for (const auto& piece : pieces) {
    const at::Tensor wide = piece.to(device, at::kDouble);
    rows.push_back(at::stack({wide.sum(), wide.square().sum()}));
  }
  return at::stack(rows);
}

}  // namespace

std::vector<std::string> warn_if_replicas_drifted(const ShardedView& model, const std::string& where) {
  torch::NoGradGuard no_grad;
  const Replicated replicated = replicated_params(model);
  if (replicated.names.empty()) return {};
  ProcessGroup& group = replicated.tp->group();
  const at::Tensor mine = checksums(replicated.pieces, model.compute_device());
  const at::Tensor first = mine.clone();
  broadcast(group, first, /*root=*/0);
  const at::Tensor differs = (mine != first).any(1).to(at::kDouble);
  all_reduce_sum(group, differs);
  model.all_reduce_over_shard_group(differs);
  const auto flags = differs.to(at::kCPU);
  std::vector<std::string> drifted;
  for (size_t i = 0; i < replicated.names.size(); ++i) {
    if (flags[static_cast<int64_t>(i)].item<double>() > 0) drifted.push_back(replicated.names[i]);
  }
  if (!drifted.empty() && model.world().rank() == 0) {
    std::ostringstream names;
    for (size_t i = 0; i < drifted.size(); ++i) names << (i ? ", " : "") << "'" << drifted[i] << "'";
    std::cerr << "fsdp: warning: " << where << ": the replicated parameters " << names.str()
              << " differ across the ranks of a tensor-parallel group (each rank holds them whole; "
              "they drifted apart: dropout seeded per rank, `seed + rank`, in a replicated region?). "
              "The save keeps tp rank 0's values. Seed with fsdp::tp::manual_seed(mesh, seed) (one "
              "generator state per tp group) instead of torch::manual_seed(seed + rank)\n";
  }
  return drifted;
}

}  // namespace fsdp::detail
