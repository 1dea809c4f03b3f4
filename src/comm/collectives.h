#pragma once
// The collectives FSDP needs, behind one interface: all-gather into a persistent flat buffer,
// reduce-scatter out of one, all-reduce and broadcast. The ring implementation moves exactly the
// bytes of DESIGN.md's formulas over any c10d backend's send/recv (Gloo's own all-gather copies
// through a fresh buffer, and its reduce-scatter is an all-reduce in disguise). A backend with
// native collectives (NCCL) can implement the same interface.

#include <fsdp/distributed.h>

#include <ATen/core/Tensor.h>

#include <memory>

namespace fsdp {

class Collectives {
 public:
  virtual ~Collectives() = default;

  /// full (1-D, size W·S) <- the shards of all ranks, rank i's at [i·S, (i+1)·S).
  /// `shard` (1-D, size S) may be a view of `full`'s own chunk.
  virtual void all_gather(const at::Tensor& full, const at::Tensor& shard) = 0;
  /// shard (1-D, size S) <- sum over ranks of their full[rank·S, (rank+1)·S).
  /// `full` (1-D, size W·S) is used as scratch and holds garbage afterwards.
  virtual void reduce_scatter_sum(const at::Tensor& shard, const at::Tensor& full) = 0;
  /// t <- sum over ranks of t.
  virtual void all_reduce_sum(const at::Tensor& t) = 0;
  /// t <- rank `root`'s t.
  virtual void broadcast(const at::Tensor& t, int root) = 0;

  virtual int rank() const = 0;
  virtual int size() const = 0;
};

/// Ring collectives over `group`'s send/recv.
std::unique_ptr<Collectives> make_ring_collectives(ProcessGroup& group);

/// Collectives on device tensors staged through host buffers (pinned for CUDA) and run by
/// `host` (rings over Gloo): lets ranks that share a GPU, which NCCL refuses, run the CUDA path.
std::unique_ptr<Collectives> make_staged_collectives(std::unique_ptr<Collectives> host);

/// What one rank sent, for comm_stats(): every Collectives implementation counts here.
enum class CollectiveKind { AllGather, ReduceScatter, AllReduce, Broadcast };
void count_sent_bytes(CollectiveKind kind, int64_t bytes);

}  // namespace fsdp
