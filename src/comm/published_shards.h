#pragma once
// Shards published for a whole forward and backward ([Note: decoupled collectives] in
// shm_collectives.cpp): each rank copies its small units' shards into a board of its own in a
// shared-memory segment when the root's forward starts, and an all-gather of such a unit copies
// the peers' shards from their boards, without waiting for them to reach that unit.

#include "comm/shm_segment.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fsdp {

/// Shards whose unit's unsharded buffer is larger than this are not published: a board for them
/// would hold the model's shards twice more in /dev/shm, for collectives whose bandwidth, not
/// their meeting, is the cost. (Units of 0.8 MB, bench's small, still gain: 0.98 × the step.)
constexpr int64_t kPublishedUnitBytes = 4 << 20;
/// At most this many bytes of shards per rank and board (the first units' that fit).
constexpr int64_t kPublishedBoardBytes = 16 << 20;

class PublishedShards {
 public:
  /// Collective over `group` (all on this host): a board for those of `shards` (this rank's; the
  /// same count, sizes and dtypes on every rank) that kPublishedUnitBytes and
  /// kPublishedBoardBytes admit. nullptr on every rank when none is admitted, or when the segment
  /// could not be set up (then `why_not` says why).
  static std::unique_ptr<PublishedShards> join(ProcessGroup& group, const std::vector<at::Tensor>& shards,
                                               std::string* why_not);

  /// The root's forward starts: copies this rank's admitted `shards` (as at join) into its board
  /// of the next generation (two boards alternate), once every peer has published the previous
  /// generation, i.e. reads the one before it no more.
  void publish(const std::vector<at::Tensor>& shards);
  /// Whether shard `index` is on the board.
  bool holds(size_t index) const { return index < offsets_.size() && offsets_[index] >= 0; }
  /// full (1-D, W·S) <- the shards `index` of every rank's current generation (this rank's from
  /// `shard`, which may be a view of full's own chunk), once each peer has published it.
  void all_gather(const at::Tensor& full, const at::Tensor& shard, size_t index);
  /// The bytes of the admitted shards (per rank and board).
  int64_t board_bytes() const { return board_bytes_; }

 private:
  PublishedShards(std::unique_ptr<ShmSegment> segment, std::vector<int64_t> offsets, int64_t board_bytes)
      : segment_(std::move(segment)), offsets_(std::move(offsets)), board_bytes_(board_bytes) {}

  std::unique_ptr<ShmSegment> segment_;  // round n = generation n, in slot n % 2
  std::vector<int64_t> offsets_;         // per shard, its offset in a board; -1: not admitted
  int64_t board_bytes_;
  bool published_ = false;  // a generation is current
};

}  // namespace fsdp
