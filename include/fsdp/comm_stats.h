#pragma once
/// Bytes this process sent through each kind of collective (sum over all process groups).

#include <cstdint>

namespace fsdp {

/// Bytes sent by this rank, per kind of collective, since start or the last reset_comm_stats().
/// These count what the ring algorithms really put on the wire, not a formula.
struct CommStats {
  int64_t all_gather_bytes = 0;
  int64_t reduce_scatter_bytes = 0;
  int64_t all_reduce_bytes = 0;
  int64_t broadcast_bytes = 0;
  /// Muon's exchanges (fsdp::optim::Muon): what went to other ranks, not the rank's own part.
  int64_t all_to_all_bytes = 0;
  /// Tensor parallelism's collectives (fsdp::tp): activations gathered and reduce-scattered along
  /// the sequence, row-wise outputs and replicated gradients all-reduced, the loss's row
  /// statistics. Counted here only, not in the FSDP kinds above; docs/tensor-parallel.md has
  /// their formulas.
  int64_t tp_all_gather_bytes = 0;
  int64_t tp_reduce_scatter_bytes = 0;
  int64_t tp_all_reduce_bytes = 0;
  /// The library's checks that run on some steps only (the gradient watch's all-reduces: after
  /// the first three backwards and every 100th): in no per-step formula, so apart.
  int64_t check_bytes = 0;
  /// Pipeline parallelism's point-to-point sends (fsdp::pp): each activation and each gradient
  /// between stages on two ranks, its 80-byte header (dtype, dimensions, 8 sizes as int64)
  /// included, and the gradients of tied weights exchanged between the ranks holding them.
  /// Hand-offs between two stages on one rank move nothing. docs/pipeline-parallel.md has the formula.
  int64_t pp_send_bytes = 0;
};

CommStats comm_stats();
void reset_comm_stats();

}  // namespace fsdp
