#pragma once
// The collectives FSDP needs, behind one interface: all-gather into a persistent flat buffer,
// reduce-scatter out of one, all-reduce and broadcast. Implementations: rings over any c10d
// backend's send/recv (ring_collectives.cpp), shared memory between the ranks of one host
// (shm_collectives.h), NCCL's own (nccl_collectives.cpp), and device tensors staged through host
// buffers (staged_collectives.cpp). Each counts the bytes it sends (comm_stats.cpp).

#include <fsdp/distributed.h>

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

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
  /// received <- what the members sent this rank: `send` (1-D) holds send_numels[r] elements for
  /// member r, one after another; `received` (1-D) gets receive_numels[r] from member r, in
  /// member order. Counted in comm_stats().all_to_all_bytes (what leaves for other members).
  virtual void all_to_all(const at::Tensor& received, const at::Tensor& send, const std::vector<int64_t>& send_numels,
                          const std::vector<int64_t>& receive_numels) = 0;

  virtual int rank() const = 0;
  virtual int size() const = 0;
};

/// Ring collectives over `group`'s send/recv.
std::unique_ptr<Collectives> make_ring_collectives(ProcessGroup& group);

/// Collectives on device tensors staged through host buffers (pinned for CUDA) and run by
/// `host` (rings over Gloo): lets ranks that share a GPU, which NCCL refuses, run the CUDA path.
std::unique_ptr<Collectives> make_staged_collectives(std::unique_ptr<Collectives> host);

/// A host tensor shaped like `t`, pinned when `t` is on a GPU: where a device tensor's
/// collective over Gloo runs.
at::Tensor host_staging_buffer(const at::Tensor& t);

/// What one rank sent, for comm_stats(): every Collectives implementation counts here.
enum class CollectiveKind { AllGather, ReduceScatter, AllReduce, Broadcast, AllToAll };
void count_sent_bytes(CollectiveKind kind, int64_t bytes);
/// While one lives, the collectives this thread runs count as tensor parallelism's
/// (comm_stats().tp_*): TP's collectives run on the caller's thread, FSDP's own on theirs.
class TensorParallelCounting {
 public:
  TensorParallelCounting();
  ~TensorParallelCounting();
  TensorParallelCounting(const TensorParallelCounting&) = delete;
  TensorParallelCounting& operator=(const TensorParallelCounting&) = delete;

 private:
  bool outer_;
};

/// While one lives, the collectives this thread runs count as the library's occasional checks
/// (comm_stats().check_bytes), whatever their kind.
class CheckCounting {
 public:
  CheckCounting();
  ~CheckCounting();
  CheckCounting(const CheckCounting&) = delete;
  CheckCounting& operator=(const CheckCounting&) = delete;

 private:
  bool outer_;
};

/// Whom a collective waits on: this rank's ring neighbours, or every other member of the group.
enum class PeersWaitedOn { RingNeighbours, AllMembers };
/// Runs `collective` (`what`, over `group`), turning whatever the backend throws (a timeout, a
/// closed connection) into one error that names the peers waited on and what to look at next.
void run_guarded(const ProcessGroup& group, const char* what, PeersWaitedOn peers,
                 const std::function<void()>& collective);

/// t <- the sum of t over `group`, by its backend's own all-reduce; t is a host tensor.
void backend_all_reduce_sum(ProcessGroup& group, const at::Tensor& t);
/// t <- rank `root`'s t, by the backend's own broadcast; t is a host tensor.
void backend_broadcast(ProcessGroup& group, const at::Tensor& t, int root);
/// Collectives::all_to_all of host tensors by `group`'s backend (Gloo) itself: what the host
/// implementations run.
void backend_all_to_all(ProcessGroup& group, const at::Tensor& received, const at::Tensor& send,
                        const std::vector<int64_t>& send_numels, const std::vector<int64_t>& receive_numels);
/// Throws unless the counts are one per member and the buffers hold their sums.
void check_all_to_all(int members, const at::Tensor& received, const at::Tensor& send,
                      const std::vector<int64_t>& send_numels, const std::vector<int64_t>& receive_numels);
/// Counts what an all-to-all sends to the members other than `rank`.
void count_all_to_all_bytes(int rank, const at::Tensor& send, const std::vector<int64_t>& send_numels);

}  // namespace fsdp
