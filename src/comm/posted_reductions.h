#pragma once
// Reduce-scatters posted now and summed later ([Note: decoupled collectives] in
// shm_collectives.cpp): a rank copies its own chunk of a unit's gradient into its gradient shard
// and the other ranks' chunks into a ring of its own in a shared-memory segment, and goes on;
// the sum is completed when someone needs it (the unit's handle is waited on, or backward ends),
// from the peers' rings. Postings are numbered in the order they are made, the same on every
// rank ([Note: collective order]); completions go in that order too.

#include "comm/shm_segment.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace fsdp {

/// The most bytes of postings a rank's ring holds; a backward's postings beyond run in rounds.
constexpr size_t kPostedRingBytes = 32 << 20;

class PostedReductions {
 public:
  /// Collective over `group` (all on this host): a ring of `capacity_bytes` per rank. nullptr on
  /// every rank when the segment could not be set up (`why_not` says why).
  static std::unique_ptr<PostedReductions> join(ProcessGroup& group, size_t capacity_bytes,
                                                std::string* why_not);

  /// Whether a reduce-scatter of `full` fits the ring without overwriting a posting made since
  /// the last complete_all() (whose peers may still be about to read it: waiting for them there
  /// could deadlock). The same answer on every rank.
  bool fits(const at::Tensor& full) const;
  /// Posts shard <- the sum over ranks of full's chunk `rank` (as reduce_scatter_sum), divided by
  /// `divide_by`: copies this rank's chunk into `shard` and the others' into the ring; `full` may
  /// be reused at once. Returns the posting's number, for complete_through. `shard` must outlive
  /// the completion.
  uint32_t post(const at::Tensor& shard, const at::Tensor& full, double divide_by = 1.0);
  /// Completes every posting up to `number` that is not complete yet, in order: waits for the
  /// peers' postings, sums into the shards in the ring's order (and divides).
  void complete_through(uint32_t number);
  /// Completes every posting; later postings may reuse the whole ring.
  void complete_all();

 private:
  struct Posting {
    uint32_t number = 0;
    int64_t start = 0;        // unwrapped byte offset in the ring
    at::Tensor shard;         // holds this rank's own chunk until the sum
    int64_t piece_bytes = 0;  // each peer's piece, rounded up to 64 bytes
    double divide_by = 1.0;   // applied to the sum, in the same pass
  };

  explicit PostedReductions(std::unique_ptr<ShmSegment> segment) : segment_(std::move(segment)) {}
  /// Where a posting of `set_bytes` starts: at `next_`, or at the ring's start if it would wrap.
  int64_t start_for(int64_t set_bytes) const;
  /// Where, in the set of pieces rank `from` posts, its piece of rank `to`'s chunk lies.
  int piece_index(int to, int from) const;
  void complete(const Posting& posting);

  std::unique_ptr<ShmSegment> segment_;  // one slot per rank: the ring
  mutable std::mutex post_mutex_;        // post() and fits() against complete_all()
  std::mutex complete_mutex_;            // one completer at a time
  std::mutex pending_mutex_;             // guards pending_
  std::deque<Posting> pending_;          // posted, not yet summed
  std::deque<std::pair<uint32_t, int64_t>> in_ring_;  // (number, start) of postings still in the ring
  uint32_t posted_ = 0;                  // postings made
  int64_t next_ = 0;                     // unwrapped offset of the next posting
  int64_t epoch_start_ = 0;              // next_ at the last complete_all()
};

}  // namespace fsdp
